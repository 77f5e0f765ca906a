"""The README's word count, whose partial count fails once (the observability tests need a
real run with a failure and a restart): the first attempt that finds no marker file at
$SLUICE_TEST_FAIL_ONCE writes it and raises; every later attempt runs. ``restart_delay_ms``
(default 100) is the restart's delay (the clock tests step a clock while a long one waits),
``queryable=no`` publishes no state."""

import os
from pathlib import Path

from pyspark.sql import functions as F

from sluice.api import Job
from sluice.events import RestartStrategy


def partial_count(lines):
    marker = Path(os.environ["SLUICE_TEST_FAIL_ONCE"])
    if not marker.exists():
        marker.write_text("failed once")
        raise RuntimeError("flaky input: the first attempt fails")
    words = F.explode(F.split(F.lower(F.col("value")), r"[^a-z0-9']+")).alias("word")
    return lines.select(words).where(F.col("word") != "").groupBy("word").agg(F.count(F.lit(1)).alias("count"))


def total(partials):
    return partials.groupBy("word").agg(F.sum("count").alias("count"))


def job(params):
    j = Job("flaky-wordcount", restart=RestartStrategy("fixed-delay", 3, int(params.get("restart_delay_ms", 100))))
    lines = j.read_text("lines", params["input"], parallelism=2, split_bytes=int(params.get("split_bytes", 4096)))
    queryable = None if params.get("queryable") == "no" else "word-counts"
    counts = (
        lines.map("count words", partial_count)
        .key_by("word")
        .map("sum counts", total, parallelism=2, queryable=queryable)
    )
    counts.write_parquet("out", params["output"])
    return j.graph()
