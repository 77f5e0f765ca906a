"""The chaos suite's job: three stages and two keyed exchanges over words.

    lines -> words (split, and count within the task: a combiner)
          -- key_by(word) --> per word (word, count)
          -- key_by(count) --> per count (count, words with that count, sum of their CRC32s)
          -> Parquet sink

The last stage's ``crc`` makes the small result depend on exactly which word got which
count: a word counted once too often or too rarely moves its CRC32 to another row.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sluice.api import Job
from sluice.events import RestartStrategy


def words(lines: DataFrame) -> DataFrame:
    word = F.explode(F.split(F.col("value"), " ")).alias("word")
    return lines.select(word).where(F.col("word") != "").groupBy("word").agg(F.count(F.lit(1)).alias("n"))


def per_word(partials: DataFrame) -> DataFrame:
    return partials.groupBy("word").agg(F.sum("n").alias("count"))


def per_count(counts: DataFrame) -> DataFrame:
    crc = F.crc32(F.col("word").cast("binary"))
    return counts.groupBy("count").agg(F.count(F.lit(1)).alias("words"), F.sum(crc).alias("crc"))


def job(params: dict[str, str]):
    # Every kill may fail a few attempts: the restarts are there to be spent on them.
    j = Job("chaos", restart=RestartStrategy("fixed-delay", attempts=1000, delay_ms=200))
    lines = j.read_text(
        "lines",
        params["input"],
        parallelism=int(params.get("parallelism", 4)),
        split_bytes=int(params.get("split_bytes", 256 * 1024)),
    )
    partials = lines.map("words", words)
    reducers = int(params.get("reducers", 2))
    counts = partials.key_by("word").map("per word", per_word, parallelism=reducers)
    histogram = counts.key_by("count").map("per count", per_count, parallelism=reducers)
    histogram.write_parquet("out", params["output"])
    return j.graph()
