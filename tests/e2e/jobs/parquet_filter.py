"""Parquet in, a filter on a column, Parquet out: with fewer splits than readers, a reader
that gets no split must still produce the source's columns (no rows)."""

from pyspark.sql import functions as F

from sluice.api import Job


def keep_even(df):
    return df.where(F.col("n") % 2 == 0)


def job(params):
    j = Job("parquet-filter")
    rows = j.read_parquet("rows", params["input"], parallelism=int(params.get("parallelism", 3)))
    rows.map("keep even", keep_even).write_parquet("out", params["output"])
    return j.graph()
