"""A split's chunk (services/dataplane/chunks.py), on the test run's real Spark: written by
the worker through Arrow when the split is small and every type survives, else by Spark;
either way Spark reads back the same rows with the same schema."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sluice.services.dataplane.chunks import ARROW_CHUNK_BYTES, arrow_writable, input_bytes, write_chunk

SCHEMA = T.StructType(
    [
        T.StructField("b", T.ByteType()),
        T.StructField("s", T.ShortType()),
        T.StructField("i", T.IntegerType()),
        T.StructField("l", T.LongType()),
        T.StructField("f", T.FloatType()),
        T.StructField("d", T.DoubleType()),
        T.StructField("dec", T.DecimalType(20, 4)),
        T.StructField("small_dec", T.DecimalType(9, 2)),
        T.StructField("str", T.StringType()),
        T.StructField("bin", T.BinaryType()),
        T.StructField("ok", T.BooleanType()),
        T.StructField("day", T.DateType()),
        T.StructField("ts", T.TimestampType()),
        T.StructField("ts_ntz", T.TimestampNTZType()),
        T.StructField("arr", T.ArrayType(T.LongType())),
        T.StructField("m", T.MapType(T.StringType(), T.DoubleType())),
        T.StructField("st", T.StructType([T.StructField("x", T.IntegerType()), T.StructField("y", T.StringType())])),
    ]
)

ROWS = [
    (
        1,
        2,
        3,
        4,
        1.5,
        2.25,
        Decimal("12345678901234.5678"),
        Decimal("1234567.89"),
        "héllo",
        b"\x00\x01",
        True,
        dt.date(1969, 12, 31),
        dt.datetime(2024, 2, 29, 23, 59, 58, 123456),
        dt.datetime(1900, 1, 1, 0, 0, 1),
        [1, None, 3],
        {"a": 1.0, "b": None},
        (7, "seven"),
    ),
    (None,) * 17,
    (
        -128,
        -32768,
        -(2**31),
        -(2**63),
        float("inf"),
        float("nan"),
        Decimal("-0.0001"),
        Decimal("0.00"),
        "",
        b"",
        False,
        dt.date(9999, 12, 31),
        dt.datetime(1970, 1, 1),
        dt.datetime(2262, 4, 11, 23, 47, 16),
        [],
        {},
        (None, None),
    ),
]


def _frame(spark):
    return spark.createDataFrame(ROWS, SCHEMA)


def _rows(df) -> list:
    return sorted(repr(r) for r in df.collect())


@pytest.mark.parametrize("size, by", [(1000, "arrow"), (ARROW_CHUNK_BYTES + 1, "spark"), (None, "spark")])
def test_a_chunk_reads_back_as_the_same_rows_and_schema_whoever_wrote_it(
    spark, tmp_path: Path, size: int | None, by: str
) -> None:
    df = _frame(spark)
    chunk = tmp_path / "chunk"
    (chunk / "stale").mkdir(parents=True)  # a chunk written before by an attempt that failed
    schema = write_chunk(df, chunk, size)
    assert schema == df.schema
    written = sorted(p.name for p in chunk.iterdir())
    if by == "arrow":
        assert written == ["part-00000.parquet"]
    else:
        assert "_SUCCESS" in written and "stale" not in written
    back = spark.read.schema(schema).parquet(str(chunk))
    assert back.schema == df.schema
    assert _rows(back) == _rows(df)
    # files of both kinds read together, as a subtask's chunks are
    other = tmp_path / "other"
    write_chunk(df, other, ARROW_CHUNK_BYTES + 1 if by == "arrow" else 1000)
    assert _rows(spark.read.schema(schema).parquet(str(chunk), str(other))) == sorted(_rows(df) * 2)


def test_an_empty_result_is_a_chunk_of_no_rows_with_its_columns(spark, tmp_path: Path) -> None:
    df = _frame(spark).limit(0)
    schema = write_chunk(df, tmp_path / "chunk", 10)
    back = spark.read.schema(schema).parquet(str(tmp_path / "chunk"))
    assert back.count() == 0 and back.columns == SCHEMA.fieldNames()


def test_types_that_would_not_read_back_as_themselves_go_through_spark(spark, tmp_path: Path) -> None:
    assert arrow_writable(SCHEMA)
    for schema in (
        T.StructType([T.StructField("gap", T.DayTimeIntervalType())]),
        T.StructType([T.StructField("ym", T.YearMonthIntervalType())]),
        T.StructType([T.StructField("a", T.LongType()), T.StructField("a", T.LongType())]),
        T.StructType([T.StructField("st", T.StructType([T.StructField("c", T.CharType(3))]))]),
        T.StructType([T.StructField("arr", T.ArrayType(T.NullType()))]),
        T.StructType([]),
    ):
        assert not arrow_writable(schema), schema
    df = spark.range(3).select(F.make_dt_interval(F.lit(0), F.lit(0), F.col("id")).alias("gap"))
    chunk = tmp_path / "chunk"
    schema = write_chunk(df, chunk, 10)
    assert "_SUCCESS" in {p.name for p in chunk.iterdir()}  # Spark wrote it
    assert _rows(spark.read.schema(schema).parquet(str(chunk))) == _rows(df)


def test_a_splits_size_is_what_its_rows_take_uncompressed_or_unknown(tmp_path: Path) -> None:
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    assert input_bytes((10, 20)) == 80
    text = tmp_path / "split-00000-ab.txt"
    text.write_text("x" * 1000)
    assert input_bytes(text) == 1000
    parquet = tmp_path / "split-00001-ab.parquet"
    pq.write_table(pa.table({"n": list(range(100_000))}), parquet, row_group_size=30_000, compression="zstd")
    assert input_bytes(parquet) > parquet.stat().st_size  # its rows, not its compressed bytes
    assert input_bytes(parquet) >= 8 * 100_000 * 0.9
    gz = tmp_path / "split-00002-ab.txt.gz"
    gz.write_bytes(gzip.compress(b"x" * 10_000))
    assert input_bytes(gz) is None  # could be any size unpacked: Spark writes its chunk
    broken = tmp_path / "split-00003-ab.parquet"
    broken.write_bytes(b"not parquet")
    assert input_bytes(broken) is None
