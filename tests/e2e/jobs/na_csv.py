"""The issue's pipeline in small: CSV whose missing values are written NA, delays averaged per
carrier. Read as strings and cast with Spark's ANSI casts, an NA fails the cast
(CAST_INVALID_INPUT): a deterministic error, so the job fails after one attempt. Read with
``null_value="NA"`` and a schema, the NAs are nulls and the job finishes."""

from pyspark.sql import functions as F

from sluice.api import Job
from sluice.events import RestartStrategy


def cast_delay(df):
    return df.select("carrier", F.col("dep_delay").cast("int").alias("dep_delay"))


def mean_delay(df):
    return df.groupBy("carrier").agg(F.avg("dep_delay").alias("mean_delay"), F.count("*").alias("flights"))


def job(params):
    j = Job("na-csv", restart=RestartStrategy("fixed-delay", 3, 100))
    if params.get("fixed") == "true":
        flights = j.read_csv(
            "flights", params["input"], null_value="NA", schema="carrier STRING, dep_delay INT", parallelism=2
        )
    else:
        flights = j.read_csv("flights", params["input"], schema="carrier STRING, dep_delay STRING", parallelism=2)
        flights = flights.map("cast delay", cast_delay)
    flights.key_by("carrier").map("mean delay", mean_delay, parallelism=1).write_parquet("out", params["output"])
    return j.graph()
