"""Word count whose reducer subtask 0 straggles: the first of its attempts to get there
sleeps ``STRAGGLE_S`` before it builds its DataFrame (in the task's own process), every
later one (its speculative attempt) goes at once. Which attempt got there first is a marker
file in the cluster's home (``$SLUICE_HOME``, which both TaskManagers share)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sluice.api import Job, task_context

STRAGGLE_S = 600.0


def tokenize(lines: DataFrame) -> DataFrame:
    words = F.explode(F.split(F.lower(F.col("value")), r"[^a-z0-9']+")).alias("word")
    return lines.select(words).where(F.col("word") != "").groupBy("word").agg(F.count(F.lit(1)).alias("count"))


def total(partials: DataFrame) -> DataFrame:
    ctx = task_context()
    if ctx.subtask == 0:
        marker = Path(os.environ["SLUICE_HOME"]) / "straggled"
        try:
            with marker.open("x") as f:  # the first attempt here: it straggles (until cancelled)
                f.write(str(ctx.attempt))
            time.sleep(STRAGGLE_S)
        except FileExistsError:
            pass
    return partials.groupBy("word").agg(F.sum("count").alias("count"))


def job(params):
    j = Job("straggler")
    lines = j.read_text("lines", params["input"], parallelism=2)
    partials = lines.map("count words", tokenize)
    counts = partials.key_by("word").map("sum counts", total, parallelism=4, queryable=None)
    counts.write_parquet("out", params["output"])
    return j.graph()
