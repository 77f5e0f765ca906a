"""Exchanges: keyed output lands on the consumer that owns the key's group; empty producers; sinks."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from sluice.services.dataplane import (
    SCHEMA_FILE,
    DataplaneError,
    SchemaError,
    key_group_of,
    key_group_range,
    operator_index_for_key_group,
    read_inputs,
    write_partition,
    write_sink,
)

MAX_PARALLELISM = 128


def test_keyed_round_trip_three_producers_four_consumers(spark, tmp_path: Path) -> None:
    rng = random.Random(11)
    keys = [f"key-{i}-{'é' * (i % 3)}" for i in range(300)]
    rows = [(rng.choice(keys), i) for i in range(900)]
    df = spark.createDataFrame(rows, "k string, n bigint")
    producers = [str(tmp_path / f"producer-{p}") for p in range(3)]
    for p, path in enumerate(producers):
        write_partition(df.where(df.n % 3 == p), path, key="k", max_parallelism=MAX_PARALLELISM)
    consumers = [
        read_inputs(spark, producers, key_groups=key_group_range(MAX_PARALLELISM, 4, c)).collect() for c in range(4)
    ]
    assert all(set(r.asDict()) == {"k", "n"} for got in consumers for r in got)
    assert Counter((r.k, r.n) for got in consumers for r in got) == Counter(rows)  # every row exactly once
    for c, got in enumerate(consumers):
        for r in got:
            assert operator_index_for_key_group(key_group_of(r.k, MAX_PARALLELISM), MAX_PARALLELISM, 4) == c, r.k


def test_empty_producers(spark, tmp_path: Path) -> None:
    df = spark.createDataFrame([("a", 1), ("b", 2)], "k string, n bigint")
    full, empty = str(tmp_path / "full"), str(tmp_path / "empty")
    write_partition(df, full, key="k", max_parallelism=MAX_PARALLELISM)
    write_partition(df.limit(0), empty, key="k", max_parallelism=MAX_PARALLELISM)
    assert (tmp_path / "empty" / SCHEMA_FILE).is_file()
    got = read_inputs(spark, [empty, full], key_groups=(0, MAX_PARALLELISM - 1)).collect()
    assert sorted((r.k, r.n) for r in got) == [("a", 1), ("b", 2)]
    nothing = read_inputs(spark, [empty], key_groups=(0, 63))
    assert nothing.columns == ["k", "n"] and nothing.collect() == []
    assert read_inputs(spark, [], key_groups=None, schema_hint="x int").columns == ["x"]


def test_unkeyed_round_trip_and_key_groups_need_keyed_input(spark, tmp_path: Path) -> None:
    df = spark.createDataFrame([("a", 1), ("b", 2)], "k string, n bigint")
    path = str(tmp_path / "plain")
    write_partition(df, path, key=None, max_parallelism=MAX_PARALLELISM)
    assert sorted(tuple(r) for r in read_inputs(spark, [path], key_groups=None).collect()) == [("a", 1), ("b", 2)]
    with pytest.raises(SchemaError, match="not written with a key"):
        read_inputs(spark, [path], key_groups=(0, 10))


def test_errors_name_what_is_wrong(spark, tmp_path: Path) -> None:
    df = spark.createDataFrame([("a", 1)], "word string, n bigint")
    with pytest.raises(SchemaError, match=r"key column 'k' is not in the DataFrame; its columns are: word, n"):
        write_partition(df, str(tmp_path / "out"), key="k", max_parallelism=MAX_PARALLELISM)
    with pytest.raises(DataplaneError, match="relative"):
        write_partition(df, "relative/out", key=None, max_parallelism=MAX_PARALLELISM)
    with pytest.raises(DataplaneError, match="does not exist"):
        read_inputs(spark, [str(tmp_path / "never-written")], key_groups=None)
    with pytest.raises(DataplaneError, match="key_groups must be"):
        read_inputs(spark, [str(tmp_path)], key_groups=(5, 2))
    with pytest.raises(DataplaneError, match="unknown sink format 'json'"):
        write_sink(df, str(tmp_path / "sink"), 0, 0, "json", {})


def test_keyed_output_per_consumer_writes_one_directory_per_consumer(spark, tmp_path) -> None:
    """With ``consumers`` a producer writes one directory per consumer, and every consumer
    still reads exactly the rows whose key group it owns."""
    from sluice.services.dataplane import key_group_of, operator_index_for_key_group, read_inputs, write_partition

    keys = [f"k{i}" for i in range(300)]
    df = spark.createDataFrame([(k, i) for i, k in enumerate(keys)], "key string, n long")
    out = tmp_path / "p0"
    write_partition(df, str(out), key="key", max_parallelism=128, consumers=3)
    assert len([d for d in out.iterdir() if d.name.startswith("_kg=")]) == 3
    from sluice.services.dataplane import key_group_range

    for j in range(3):
        got = {r["key"] for r in read_inputs(spark, [str(out)], key_groups=key_group_range(128, 3, j)).collect()}
        want = {k for k in keys if operator_index_for_key_group(key_group_of(k, 128), 128, 3) == j}
        assert got == want


def test_consumers_read_with_the_recorded_schema_and_infer_it_without_one(spark, tmp_path: Path) -> None:
    """The columns come from the producers' _schema.json (no footer-reading job); a producer
    that left none (written before it existed) is still read, its columns from its files."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    df = spark.createDataFrame([("a", 1), ("b", 2)], "k string, n bigint")
    path = str(tmp_path / "producer")
    write_partition(df, path, key="k", max_parallelism=MAX_PARALLELISM)
    recorded = StructType([StructField("n", LongType()), StructField("k", StringType())])  # another column order
    (tmp_path / "producer" / SCHEMA_FILE).write_text(recorded.json())
    got = read_inputs(spark, [path], key_groups=(0, MAX_PARALLELISM - 1))
    assert got.columns == ["n", "k"]  # the recorded order, not the files'
    assert sorted(tuple(r) for r in got.collect()) == [(1, "a"), (2, "b")]
    (tmp_path / "producer" / SCHEMA_FILE).unlink()
    inferred = read_inputs(spark, [path], key_groups=(0, MAX_PARALLELISM - 1))
    assert inferred.columns == ["k", "n"]
    assert sorted(tuple(r) for r in inferred.collect()) == [("a", 1), ("b", 2)]


def test_the_recorded_schema_is_used_only_when_the_producers_read_agree(spark, tmp_path: Path) -> None:
    """A producer with nothing in the consumer's range does not decide the columns (its frame
    may differ: an empty reader's, a pivot's); producers that disagree, or one that recorded
    nothing, leave the columns to the files."""
    df = spark.createDataFrame([("a", 1), ("b", 2)], "k string, n bigint")
    empty, full = str(tmp_path / "empty"), str(tmp_path / "full")
    write_partition(spark.createDataFrame([], "other string"), empty, key="other", max_parallelism=MAX_PARALLELISM)
    write_partition(df, full, key="k", max_parallelism=MAX_PARALLELISM)
    got = read_inputs(spark, [empty, full], key_groups=(0, MAX_PARALLELISM - 1))
    assert got.columns == ["k", "n"] and sorted(tuple(r) for r in got.collect()) == [("a", 1), ("b", 2)]

    other = str(tmp_path / "other")
    write_partition(df, other, key="k", max_parallelism=MAX_PARALLELISM)
    (tmp_path / "other" / SCHEMA_FILE).write_text(
        '{"type": "struct", "fields": [{"name": "n", "type": "long", "nullable": true, "metadata": {}}]}'
    )  # disagrees with full's
    both = read_inputs(spark, [full, other], key_groups=(0, MAX_PARALLELISM - 1))
    assert both.columns == ["k", "n"] and both.count() == 4  # from the files: no column dropped
    (tmp_path / "other" / SCHEMA_FILE).unlink()  # one without a record
    assert read_inputs(spark, [full, other], key_groups=(0, MAX_PARALLELISM - 1)).columns == ["k", "n"]

    plain = str(tmp_path / "unkeyed")
    write_partition(df, plain, key=None, max_parallelism=MAX_PARALLELISM)
    (tmp_path / "unkeyed" / SCHEMA_FILE).write_text(
        '{"type": "struct", "fields": [{"name": "n", "type": "long", '
        '"nullable": true, "metadata": {}}, {"name": "k", "type": '
        '"string", "nullable": true, "metadata": {}}]}'
    )
    assert read_inputs(spark, [plain], key_groups=None).columns == ["n", "k"]  # unkeyed inputs use it too


@pytest.mark.parametrize("partitions", [1, 2])
def test_keyed_output_written_from_the_tasks_share_of_partitions_needs_no_shuffle(
    spark, tmp_path: Path, partitions: int
) -> None:
    """Given the task's share of partitions (taskmanager.share), a producer still writes one
    file per consumer directory from a DataFrame of many more partitions (one partition:
    coalesced, without a shuffle), and every row where it belongs."""
    rows = [(f"k{i % 500}", i) for i in range(3000)]
    df = spark.createDataFrame(rows, "key string, n long").repartition(7)
    out = tmp_path / "p0"
    write_partition(df, str(out), key="key", max_parallelism=MAX_PARALLELISM, consumers=3, partitions=partitions)
    dirs = sorted(d for d in out.iterdir() if d.name.startswith("_kg="))
    assert len(dirs) == 3
    assert [len(list(d.glob("part-*.parquet"))) for d in dirs] == [1, 1, 1]
    got = [
        read_inputs(spark, [str(out)], key_groups=key_group_range(MAX_PARALLELISM, 3, j)).collect() for j in range(3)
    ]
    assert Counter((r.key, r.n) for part in got for r in part) == Counter(rows)
    for j, part in enumerate(got):
        assert {
            operator_index_for_key_group(key_group_of(r.key, MAX_PARALLELISM), MAX_PARALLELISM, 3) for r in part
        } == {j}
