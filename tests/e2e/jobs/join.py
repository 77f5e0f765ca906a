"""Joins of two Parquet inputs, ``facts`` (k, v) and ``dims`` (k, w, g), by ``params["mode"]``:

* ``keyed``: both sides keyed by ``k`` and co-partitioned, a full outer join counted per key;
* ``broadcast``: ``dims`` broadcast to every subtask of ``facts`` (no shuffle of the facts),
  a left join, then counted per ``g`` (keyed);
* ``keyed-broadcast``: ``facts`` keyed by ``k`` joined with ``dims`` broadcast, counted per key.

``limit`` sets the job's broadcast limit (bytes); ``prep=1`` puts a function between the
dims' source and the broadcast (so its size is known only once it ran).
"""

from pyspark.sql import functions as F

from sluice.api import Job


def full_outer_per_key(facts, dims):
    return (
        facts.join(dims, "k", "full_outer")
        .groupBy("k")
        .agg(F.count(F.lit(1)).alias("n"), F.sum("v").alias("sv"), F.sum("w").alias("sw"))
    )


def left_join(facts, dims):
    return facts.join(dims, "k", "left")


def per_group(rows):
    return rows.groupBy("g").agg(F.count(F.lit(1)).alias("n"), F.sum("v").alias("sv"), F.sum("w").alias("sw"))


def per_key(facts, dims):
    return (
        facts.join(dims, "k", "left")
        .groupBy("k")
        .agg(F.count(F.lit(1)).alias("n"), F.sum("v").alias("sv"), F.sum("w").alias("sw"))
    )


def prep(dims):
    return dims.where(F.col("k") >= 0)


def job(params):
    j = Job("join-" + params["mode"], broadcast_limit_bytes=int(params.get("limit", 64 * 1024 * 1024)))
    p = int(params.get("parallelism", 3))
    facts = j.read_parquet("facts", params["facts"], parallelism=p, split_bytes=int(params.get("split_bytes", 1 << 20)))
    dims = j.read_parquet("dims", params["dims"], parallelism=2)
    if params.get("prep") == "1":
        dims = dims.map("prep", prep)
    mode = params["mode"]
    if mode == "keyed":
        out = facts.key_by("k").join(dims.key_by("k"), "join", full_outer_per_key, parallelism=p + 1)
    elif mode == "broadcast":
        out = facts.map("enrich", left_join, also=[dims.broadcast()]).key_by("g").map("per group", per_group)
    elif mode == "keyed-broadcast":
        out = facts.key_by("k").join(dims.broadcast(), "join", per_key, parallelism=p + 1)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    out.write_parquet("out", params["output"])
    return j.graph()
