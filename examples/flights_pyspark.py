"""``examples/flights.py`` in plain PySpark, on one Spark session: the flights joined with
their planes by tail number, totalled per manufacturer. The oracle its tests compare with.

    python examples/flights_pyspark.py FLIGHTS_CSV PLANES_CSV
"""

from __future__ import annotations

import sys

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F


def flights_per_manufacturer(spark: SparkSession, flights_csv: str, planes_csv: str) -> DataFrame:
    options = {"header": "true", "inferSchema": "true"}
    flights = spark.read.options(**options).csv(flights_csv)
    planes = spark.read.options(**options).csv(planes_csv)
    legs = flights.where(F.col("tailnum").isNotNull() & (F.col("tailnum") != "NA")).select(
        F.col("tailnum").cast("string").alias("tailnum"), F.col("distance").cast("long").alias("distance")
    )
    seats = planes.select(
        F.col("tailnum").cast("string").alias("tailnum"),
        F.col("manufacturer").cast("string").alias("manufacturer"),
        F.col("seats").cast("long").alias("seats"),
    )
    return (
        legs.join(seats, "tailnum", "inner")
        .groupBy("manufacturer")
        .agg(
            F.count(F.lit(1)).cast("long").alias("flights"),
            F.sum("distance").cast("long").alias("distance_miles"),
            F.sum(F.col("distance") * F.col("seats")).cast("long").alias("seat_miles"),
        )
    )


if __name__ == "__main__":
    session = SparkSession.builder.getOrCreate()
    flights_per_manufacturer(session, sys.argv[1], sys.argv[2]).orderBy(F.desc("flights")).show(40, truncate=False)
