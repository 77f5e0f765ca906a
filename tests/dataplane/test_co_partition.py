"""Co-partitioned inputs on real Spark (issue 32): two producers keyed by the same hash into
the same key groups put a key's rows from both on one consumer subtask, so joining each
subtask's inputs and taking the union is the join of the whole; key columns of different
types (which hash differently) are refused before the transform runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.errors import SchemaError
from sluice.events import ProducerPartitions, TaskDeploymentDescriptor, TaskInput
from sluice.services.dataplane import key_group_range, write_partition
from sluice.services.taskmanager.inputs import check_key_types, read_task_inputs

GROUPS, CONSUMERS = 16, 3


def produce(df, root: Path, name: str, key: str, producers: int = 2) -> ProducerPartitions:
    """``df`` written by ``producers`` subtasks, keyed for CONSUMERS consumers."""
    from pyspark.sql import functions as F

    for p in range(producers):
        part = df.where(F.pmod(F.hash(F.monotonically_increasing_id()), F.lit(producers)) == p)
        write_partition(part, str(root / name / str(p) / "0"), key=key, max_parallelism=GROUPS, consumers=CONSUMERS)
    return ProducerPartitions(str(root / name) + "/{subtask}/{attempt}", producers, {})


def task(subtask: int, *inputs: tuple[ProducerPartitions, str, str]) -> TaskDeploymentDescriptor:
    groups = list(key_group_range(GROUPS, CONSUMERS, subtask))
    return TaskDeploymentDescriptor(
        "j",
        f"join:{subtask}:0",
        "join",
        subtask,
        0,
        CONSUMERS,
        GROUPS,
        "transform",
        "0" * 64,
        "m",
        [],
        {},
        [TaskInput(producer=p, key_groups=groups, consumer=subtask, vertex=v, key=k) for p, v, k in inputs],
    )


@pytest.mark.slow  # ~40 s on a busy machine: four keyed writes, six reads
def test_each_subtask_joins_its_key_groups_of_both_sides_and_together_they_make_the_whole_join(
    spark, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    # Key 0 is hot on the left; keys 300.. have no right side, keys ..-1 no left side.
    left = spark.range(400).select((F.col("id") % 330).alias("k"), F.col("id").alias("v"))
    left = left.unionByName(spark.range(200).select(F.lit(0).cast("long").alias("k"), F.col("id").alias("v")))
    right = spark.range(-20, 300).select(F.col("id").alias("key"), (F.col("id") * 7).alias("w"))
    a = produce(left, tmp_path, "a", "k")
    b = produce(right, tmp_path, "b", "key")
    got = []
    for s in range(CONSUMERS):
        frames = read_task_inputs(spark, task(s, (a, "a", "k"), (b, "b", "key")), lambda df: df)
        got += frames[0].join(frames[1], F.col("k") == F.col("key"), "full_outer").collect()
    want = left.join(right, F.col("k") == F.col("key"), "full_outer").collect()
    assert sorted(map(tuple, got), key=str) == sorted(map(tuple, want), key=str)
    assert len(want) == 600 + 20  # every left row matched or not, the right-only keys once


def test_key_columns_of_different_types_are_refused_naming_both_inputs(spark) -> None:
    a = ProducerPartitions("/a/{subtask}/{attempt}", 1, {})
    b = ProducerPartitions("/b/{subtask}/{attempt}", 1, {})
    d = task(0, (a, "a", "k"), (b, "b", "k"))
    frames = [spark.createDataFrame([], "k bigint, v string"), spark.createDataFrame([], "v string, k int")]
    check_key_types(d, [frames[0], frames[0]])  # one type: fine
    with pytest.raises(SchemaError) as refused:
        check_key_types(d, frames)
    assert str(refused.value) == (
        "vertex 'join' joins 'a' keyed by 'k' (bigint) with 'b' keyed by 'k' (int): keys of different types hash "
        "differently, so equal keys would land on different subtasks; cast one side's key to the other's type "
        "before the join (F.col('k').cast('bigint'))"
    )
