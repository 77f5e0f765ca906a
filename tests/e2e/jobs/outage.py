"""Word count whose source tasks leave a marker (their worker's pid) and linger a moment
after reading, so a test can take Redis away while tasks still run and finish."""

import os
import time
from pathlib import Path

from pyspark.sql import functions as F

from sluice.api import Job


def linger(lines):
    markers = Path(os.environ["SLUICE_TEST_MARKERS"])
    markers.mkdir(parents=True, exist_ok=True)
    (markers / f"{os.getpid()}-{time.monotonic_ns()}").write_text(str(os.getpid()))
    time.sleep(float(os.environ.get("SLUICE_TEST_LINGER_S", "2")))
    words = F.explode(F.split(F.lower(F.col("value")), r"[^a-z0-9']+")).alias("word")
    return lines.select(words).where(F.col("word") != "").groupBy("word").agg(F.count(F.lit(1)).alias("count"))


def total(partials):
    return partials.groupBy("word").agg(F.sum("count").alias("count"))


def job(params):
    j = Job("outage")
    lines = j.read_text("lines", params["input"], parallelism=2, split_bytes=int(params.get("split_bytes", 2048)))
    counts = (
        lines.map("count words", linger).key_by("word").map("sum counts", total, parallelism=2, queryable="word-counts")
    )
    counts.write_parquet("out", params["output"])
    return j.graph()
