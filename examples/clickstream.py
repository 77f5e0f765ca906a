"""Clickstream aggregation: per-user totals over generated clickstream Parquet, with a keyed
exchange by user.

    sluice run examples/clickstream.py [--param input=DIR] [--param output=DIR]

Without an input it writes a few Parquet files of generated clicks under .sluice/examples/.
Each source task filters bot traffic and pre-aggregates per user and page; the keyed
stage (by ``user_id``) totals each user's clicks, time on site and distinct pages.
"""

from __future__ import annotations

import random
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sluice.api import Job

PAGES = ["/", "/search", "/product", "/cart", "/checkout", "/help", "/account", "/blog"]


def generate(directory: Path, files: int = 4, rows: int = 50_000, seed: int = 11) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        users = [f"user-{rng.randint(1, 5000):05d}" for _ in range(rows)]
        table = pa.table(
            {
                "user_id": users,
                "page": [rng.choice(PAGES) for _ in range(rows)],
                "ms_on_page": [rng.randint(100, 120_000) for _ in range(rows)],
                "is_bot": [rng.random() < 0.05 for _ in range(rows)],
            }
        )
        pq.write_table(table, directory / f"clicks-{f:03d}.parquet", row_group_size=10_000)


def per_user_page(clicks: DataFrame) -> DataFrame:
    human = clicks.where(~F.col("is_bot"))
    return human.groupBy("user_id", "page").agg(F.count(F.lit(1)).alias("clicks"), F.sum("ms_on_page").alias("ms"))


def per_user(partials: DataFrame) -> DataFrame:
    return partials.groupBy("user_id").agg(
        F.sum("clicks").alias("clicks"),
        (F.sum("ms") / 1000).alias("seconds_on_site"),
        F.countDistinct("page").alias("distinct_pages"),
    )


def job(params: dict[str, str]):
    source = params.get("input")
    if not source:
        directory = Path(".sluice/examples/clicks").resolve()
        if not directory.exists():
            generate(directory)
        source = str(directory)
    output = params.get("output") or str(Path(".sluice/output/clickstream").resolve())
    j = Job("clickstream")
    clicks = j.read_parquet(
        "clicks",
        source,
        parallelism=int(params.get("parallelism", 2)),
        split_bytes=int(params.get("split_bytes", 256 * 1024)),
    )
    partials = clicks.map("per user and page", per_user_page)
    partials.key_by("user_id").map("per user", per_user, parallelism=int(params.get("reducers", 2))).write_parquet(
        "out", output
    )
    return j.graph()
