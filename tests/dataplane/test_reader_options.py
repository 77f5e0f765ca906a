"""Reader options on real Spark: each one, read split by split as a source's readers read
(the API's options, planned by the source's enumerator, each split copied then read by
Spark in one scan), gives what plain PySpark gives reading the whole file with the same
options. And the failures those options let a user meet are classified as Spark raises them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sluice.api import Job
from sluice.services.coordination.source import discover
from sluice.services.dataplane.reader import materialize_split, read_materialized
from sluice.services.taskmanager.classify import classify


def sluice_read(spark, tmp: Path, method: str, path: Path, split_bytes: int, **kw):
    """What a source's readers read: (the DataFrame of every split, the number of splits)."""
    j = Job("t")
    getattr(j, method)("src", str(path), split_bytes=split_bytes, **kw)
    spec = j.graph().vertices[0].source
    assert spec is not None
    splits = discover(spec.format, spec.paths, spec.split_bytes, spec.options)
    files = [materialize_split(s, spec.options, tmp / "splits") for s in splits]
    return read_materialized(spark, spec.format, spec.options, files), len(splits)


def rows(df) -> list:
    return sorted((tuple(r) for r in df.collect()), key=repr)


def test_csv_sep_quote_null_value_schema_and_mode_read_as_plain_spark(spark, tmp_path: Path) -> None:
    """The issue's data: ';'-separated, quoted with "'", missing values written NA, a typed
    schema, and a malformed row DROPMALFORMED drops (PERMISSIVE: the NA test below): in
    splits, as Spark reads it."""
    path = tmp_path / "flights.csv"
    body = ["tailnum;year;dep_delay;carrier"]
    for i in range(300):
        delay = "NA" if i % 7 == 0 else str(i % 60 - 5)
        body.append(f"N{i:04d};{'NA' if i % 11 == 0 else 2013};{delay};'Carrier; {i % 4}'")
    body.insert(150, "N9999;2013;not-a-number;'X'")  # malformed for an INT column
    path.write_text("\n".join(body) + "\n")
    ddl = "tailnum STRING, year INT, dep_delay INT, carrier STRING"
    plain = spark.read.options(header="true", sep=";", quote="'", nullValue="NA", mode="DROPMALFORMED")
    got, n = sluice_read(
        spark, tmp_path, "read_csv", path, 1500, sep=";", quote="'", null_value="NA", schema=ddl, mode="DROPMALFORMED"
    )
    want = plain.schema(ddl).csv(str(path))
    got_rows = rows(got)
    assert n > 3 and got_rows == rows(want) and got.schema == want.schema
    assert len(got_rows) == 300 and sum(r[2] is None for r in got_rows) == len(range(0, 300, 7))  # NA -> null
    assert {r[3] for r in got_rows} == {f"Carrier; {k}" for k in range(4)}  # the quoted sep stays in its field


def test_the_na_case_gives_nulls_exactly_as_plain_spark_and_a_structtype_is_the_same_schema(
    spark, tmp_path: Path
) -> None:
    from pyspark.sql.types import IntegerType, StringType, StructField, StructType

    path = tmp_path / "planes.csv"
    path.write_text("tailnum,seats,model\n" + "".join(f"N{i},{'NA' if i % 3 else i},m{i % 5}\n" for i in range(200)))
    struct = StructType(
        [StructField("tailnum", StringType()), StructField("seats", IntegerType()), StructField("model", StringType())]
    )
    want = rows(
        spark.read.options(header="true", nullValue="NA")
        .schema("tailnum STRING, seats INT, model STRING")
        .csv(str(path))
    )
    for schema in ("tailnum STRING, seats INT, model STRING", struct):
        got, n = sluice_read(
            spark, tmp_path / str(type(schema).__name__), "read_csv", path, 700, null_value="NA", schema=schema
        )
        assert n > 2 and rows(got) == want
    assert sum(r[1] is None for r in want) == len([i for i in range(200) if i % 3])


@pytest.mark.slow
def test_csv_multi_line_reads_whole_files_and_without_it_lines_are_records_as_in_spark(spark, tmp_path: Path) -> None:
    """A quoted field holding a newline: with multi_line each file is one split (Spark does
    not split such files either), and the field keeps its newline whatever split_bytes says;
    without it a newline ends a record, in Sluice's splits as in Spark's."""
    path = tmp_path / "notes.csv"
    path.write_text("id,note\n" + "".join(f'{i},"line one\nline {i}, two"\n' for i in range(60)))
    got, n = sluice_read(spark, tmp_path / "ml", "read_csv", path, 100, multi_line=True, schema="id INT, note STRING")
    want = spark.read.options(header="true", multiLine="true").schema("id INT, note STRING").csv(str(path))
    assert n == 1 and rows(got) == rows(want) and len(rows(got)) == 60
    got, n = sluice_read(spark, tmp_path / "lines", "read_csv", path, 100, schema="id INT, note STRING")
    want = spark.read.options(header="true").schema("id INT, note STRING").csv(str(path))
    assert n > 10 and rows(got) == rows(want)


@pytest.mark.slow
def test_csv_and_text_encoding_decode_as_plain_spark_and_python_do(spark, tmp_path: Path) -> None:
    words = ["café", "naïve", "Ærø", "plain", "señor"] * 40
    path = tmp_path / "latin.csv"
    path.write_bytes(("w,n\n" + "".join(f"{w},{i}\n" for i, w in enumerate(words))).encode("latin-1"))
    got, n = sluice_read(
        spark, tmp_path / "csv", "read_csv", path, 300, encoding="ISO-8859-1", schema="w STRING, n INT"
    )
    want = spark.read.options(header="true", encoding="ISO-8859-1").schema("w STRING, n INT").csv(str(path))
    assert n > 3 and rows(got) == rows(want) and {r[0] for r in rows(got)} == set(words)
    text = tmp_path / "latin.txt"
    text.write_bytes("\n".join(words).encode("latin-1"))
    got, n = sluice_read(spark, tmp_path / "text", "read_text", text, 128, encoding="latin-1")
    # Spark's text reader has no encoding option: Python's decoding is the oracle.
    assert n > 3 and sorted(r[0] for r in got.collect()) == sorted(text.read_bytes().decode("latin-1").split("\n"))


def test_json_lines_with_a_schema_read_as_plain_spark(spark, tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    lines = [json.dumps({"user": f"u{i % 9}", "n": i, "tags": ["a", "b"][: i % 3]}) for i in range(250)]
    lines.insert(100, '{"user": "broken", "n": ')  # a malformed line
    path.write_text("\n".join(lines) + "\n")
    ddl = "user STRING, n BIGINT, tags ARRAY<STRING>"
    got, n = sluice_read(spark, tmp_path / "schema", "read_json", path, 1000, schema=ddl, mode="DROPMALFORMED")
    want = spark.read.options(mode="DROPMALFORMED").schema(ddl).json(str(path))
    assert n > 5 and rows(got) == rows(want) and len(rows(got)) == 250


@pytest.mark.slow
def test_json_lines_without_a_schema_infer_as_plain_spark(spark, tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps({"user": f"u{i % 9}", "n": i, "ok": i % 2 == 0}) + "\n" for i in range(250)))
    got, n = sluice_read(spark, tmp_path, "read_json", path, 1000)
    want = spark.read.json(str(path))
    assert n > 5 and got.schema == want.schema and rows(got) == rows(want)


def test_parquet_columns_are_pushed_down_to_the_copy_and_to_sparks_scan(spark, tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    n = 2000
    table = pa.table({"id": list(range(n)), "wide": ["x" * 200] * n, "k": [i % 7 for i in range(n)], "s": ["v"] * n})
    pq.write_table(table, path, row_group_size=400)
    got, splits = sluice_read(spark, tmp_path / "r", "read_parquet", path, 2_000, columns=["k", "id"])
    want = spark.read.parquet(str(path)).select("k", "id")
    assert splits > 1 and rows(got) == rows(want) and got.columns == ["k", "id"]
    copies = list((tmp_path / "r" / "splits").iterdir())
    assert copies and all(pq.read_schema(c).names == ["k", "id"] for c in copies)  # the wide column was never copied
    plan = got._explain_string(extended=False) if hasattr(got, "_explain_string") else ""
    read_schema = [line for line in plan.splitlines() if "ReadSchema" in line]
    assert read_schema and "struct<k:bigint,id:bigint>" in read_schema[0], plan


def test_the_failures_of_bad_data_and_bad_code_are_classified_as_spark_raises_them(spark, tmp_path: Path) -> None:
    """The real exceptions of Spark Connect: an ANSI cast of 'NA', a missing column and a
    FAILFAST malformed record are deterministic; the job's retry_on turns one back."""
    from pyspark.sql import functions as F

    path = tmp_path / "na.csv"
    path.write_text("n\n1\nNA\n3\n")
    strings = spark.read.options(header="true").schema("n STRING").csv(str(path))
    errors = []
    for action in (
        lambda: strings.select(F.col("n").cast("int")).collect(),
        lambda: strings.select("missing").collect(),
        lambda: spark.read.options(header="true", mode="FAILFAST").schema("n INT").csv(str(path)).collect(),
    ):
        with pytest.raises(Exception) as caught:
            action()
        errors.append(caught.value)
    cast, missing, failfast = (classify(e) for e in errors)
    assert not cast.retryable and "CAST_INVALID_INPUT" in (cast.why or "")
    assert not missing.retryable and (
        "AnalysisException" in (missing.why or "") or "UNRESOLVED_COLUMN" in (missing.why or "")
    )
    assert not failfast.retryable, errors[2]
    assert classify(errors[0], retry_on=["CAST_INVALID_INPUT"]).retryable
    assert classify(ConnectionResetError("peer went away")).retryable


def test_a_parquet_file_without_a_column_asked_for_is_refused_when_splits_are_planned(tmp_path: Path) -> None:
    """(No Spark: the JobManager plans the splits when the job is submitted, so it refuses it then.)"""
    from sluice.errors import SplitError

    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": [1, 2], "k": [3, 4]}), path)
    with pytest.raises(SplitError, match=r"has no column\(s\) 'kk' \(columns=...\); its columns: id, k"):
        discover("parquet", [str(path)], 1 << 20, {"columns": '["id", "kk"]'})
    multi = tmp_path / "m.csv"
    multi.write_text("a\n" * 1000)
    assert len(discover("csv", [str(multi)], 100, {"multiLine": "true"})) == 1  # whole files
    assert len(discover("json", [str(multi)], 100, {})) == 20
    packed = tmp_path / "old.txt.gz"
    packed.write_bytes(gzip.compress("café\n".encode("latin-1")))
    with pytest.raises(SplitError, match=r"old.txt.gz is compressed, and encoding='latin-1' decodes the bytes"):
        discover("text", [str(packed)], 100, {"encoding": "latin-1"})
    assert len(discover("text", [str(packed)], 100, {"encoding": "UTF-8"})) == 1


_AGREED = [  # (schema, format)
    ("a INT, b STRING", "csv"),
    ("`a b` DECIMAL(10,2) NOT NULL COMMENT 'money', c ARRAY<STRUCT<x: INT, y STRING>>", "json"),
    ("`a b` DECIMAL(10,2) NOT NULL COMMENT 'money', c ARRAY<STRUCT<x: INT, y STRING>>", "csv"),
    ("m MAP<STRING, BIGINT>, d DATE, t TIMESTAMP_NTZ, i INTERVAL DAY TO SECOND, s STRING COLLATE UTF8_LCASE", "json"),
    ("a INTEGR", "csv"),
    ("a", "csv"),
    ("a INT,", "csv"),
    ("a INT b", "csv"),
    ("a ARRAY<INT", "json"),
    ("a DECIMAL(1,2,3)", "csv"),
    ("a INT, A STRING", "csv"),
    ("v VARCHAR(5)", "csv"),
    ("s STRUCT<c: CHAR(3)>", "json"),
    ("1a INT, b VARIANT", "json"),
]


@pytest.mark.slow
def test_the_ddl_check_accepts_what_sparks_parser_accepts(spark, tmp_path: Path) -> None:
    """The submission's DDL check and Spark agree on each case (a reader given the schema
    resolves, or Spark refuses it)."""
    from sluice.services.dataplane import ddl

    empty = tmp_path / "empty"
    empty.write_text("")
    for text, fmt in _AGREED:
        try:
            getattr(spark.read.schema(text), fmt)(str(empty)).schema  # noqa: B018 (analysis runs on the server)
            spark_ok = True
        except Exception as exc:
            spark_ok, why = False, str(exc).splitlines()[0]
        ours = ddl.problems(text, flat=fmt == "csv")
        assert (ours is None) == spark_ok, (text, fmt, ours, None if spark_ok else why)
