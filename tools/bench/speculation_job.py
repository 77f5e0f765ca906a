"""The speculation benchmark's job (tools/bench/speculation.py): two readers count words,
then eight reducers sum them, each after ``$SLUICE_BENCH_WORK_S`` seconds of work (a sleep
in its task's process) times ``$SLUICE_BENCH_SLOW_FACTOR`` (set on the throttled
TaskManager: its tasks work that many times slower)."""

from __future__ import annotations

import os
import time

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sluice.api import Job


def tokenize(lines: DataFrame) -> DataFrame:
    words = F.explode(F.split(F.lower(F.col("value")), r"[^a-z0-9']+")).alias("word")
    return lines.select(words).where(F.col("word") != "").groupBy("word").agg(F.count(F.lit(1)).alias("count"))


def total(partials: DataFrame) -> DataFrame:
    work = float(os.environ.get("SLUICE_BENCH_WORK_S", "2")) * float(os.environ.get("SLUICE_BENCH_SLOW_FACTOR", "1"))
    time.sleep(work)
    return partials.groupBy("word").agg(F.sum("count").alias("count"))


def job(params: dict[str, str]):
    j = Job("speculation")
    lines = j.read_text("lines", params["input"], parallelism=2)
    partials = lines.map("count words", tokenize)
    counts = partials.key_by("word").map("sum counts", total, parallelism=int(params.get("reducers", 8)))
    counts.write_parquet("out", params["output"])
    return j.graph()
