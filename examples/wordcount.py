"""Word count: the README's main job.

    sluice run examples/wordcount.py [--param input=PATH] [--param output=PATH]

Without an input it generates a small text (a few thousand lines) under .sluice/ so it
runs with no set-up. The counts are written as Parquet (word, count) to the output, and
published as queryable state ``word-counts``, so after the run:

    sluice state get JOB word-counts the
"""

from __future__ import annotations

import random
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sluice.api import Job

WORDS = (
    "the sluice gate water flow river lock canal basin spark flink stream redis task slot split "
    "key group state log event leader epoch fence"
).split()


def tokenize(lines: DataFrame) -> DataFrame:
    words = F.explode(F.split(F.lower(F.col("value")), r"[^a-z0-9']+")).alias("word")
    return lines.select(words).where(F.col("word") != "")


def count(words: DataFrame) -> DataFrame:
    """Words to (word, count): the plain computation, also used by the benchmark's baseline."""
    return words.groupBy("word").agg(F.count(F.lit(1)).alias("count"))


def partial_count(lines: DataFrame) -> DataFrame:
    """Each source task counts its own words first (a combiner, as Flink's batch runtime
    pre-aggregates before a keyed exchange): only (word, partial count) pairs travel."""
    return count(tokenize(lines))


def total(partials: DataFrame) -> DataFrame:
    return partials.groupBy("word").agg(F.sum("count").alias("count"))


def generate(path: Path, lines: int = 20_000, seed: int = 7) -> None:
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for _ in range(lines):
            f.write(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) + "\n")


def job(params: dict[str, str]):
    source = params.get("input")
    if not source:
        path = Path(".sluice/examples/wordcount.txt").resolve()
        if not path.exists():
            generate(path)
        source = str(path)
    output = params.get("output") or str(Path(".sluice/output/wordcount").resolve())
    j = Job("wordcount")
    # split_bytes: chosen from the input's size and the readers unless given (about one
    # split a reader, never below 4 MiB), as Spark plans its file partitions.
    # each_split=yes: the partial count runs on each split as it arrives (it is a combiner:
    # the reducers sum again), which balances the Spark work across readers; worth it when
    # a split's work is well above what a Spark job costs (about a second here).
    lines = j.read_text(
        "lines",
        source,
        parallelism=int(params.get("parallelism", 2)),
        split_bytes=int(params["split_bytes"]) if params.get("split_bytes") else None,
        each_split=params.get("each_split", "no") == "yes",
    )
    partials = lines.map("count words", partial_count)
    # queryable=no: no queryable state (the benchmark's like-for-like run against plain PySpark)
    counts = partials.key_by("word").map(
        "sum counts",
        total,
        parallelism=int(params.get("reducers", 2)),
        queryable=None if params.get("queryable") == "no" else "word-counts",
    )
    counts.write_parquet("out", output)
    return j.graph()
