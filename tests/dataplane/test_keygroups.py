"""Key groups: Flink's range formulas hold, and the pure-Python hash equals Spark's."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.services.dataplane import (
    DataplaneError,
    key_group_column,
    key_group_of,
    key_group_range,
    operator_index_for_key_group,
    spark_hash,
)


@st.composite
def parallelisms(draw: st.DrawFn) -> tuple[int, int]:
    max_parallelism = draw(st.integers(1, 2048) | st.sampled_from([1, 128, 32768]))
    parallelism = draw(st.integers(1, min(max_parallelism, 512)) | st.just(max_parallelism))
    return max_parallelism, parallelism


@settings(max_examples=200, deadline=None)
@given(parallelisms())
def test_ranges_are_contiguous_disjoint_and_cover_all_key_groups(mp_p: tuple[int, int]) -> None:
    max_parallelism, parallelism = mp_p
    ranges = [key_group_range(max_parallelism, parallelism, i) for i in range(parallelism)]
    assert ranges[0][0] == 0
    assert ranges[-1][1] == max_parallelism - 1
    for (_, end), (start, _) in itertools.pairwise(ranges):
        assert start == end + 1  # contiguous and disjoint
    for start, end in ranges:
        assert start <= end  # parallelism <= max_parallelism: nobody is left without a key group


@settings(max_examples=100, deadline=None)
@given(parallelisms(), st.data())
def test_operator_index_agrees_with_ranges(mp_p: tuple[int, int], data: st.DataObject) -> None:
    max_parallelism, parallelism = mp_p
    index = data.draw(st.integers(0, parallelism - 1))
    start, end = key_group_range(max_parallelism, parallelism, index)
    for key_group in {start, end, (start + end) // 2}:
        assert operator_index_for_key_group(key_group, max_parallelism, parallelism) == index


def test_flink_reference_values() -> None:
    # Flink: KeyGroupRangeAssignment.computeKeyGroupRangeForOperatorIndex(128, 3, i)
    assert [key_group_range(128, 3, i) for i in range(3)] == [(0, 42), (43, 85), (86, 127)]
    assert [operator_index_for_key_group(kg, 128, 3) for kg in (0, 42, 43, 85, 86, 127)] == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize(
    "call",
    [
        lambda: key_group_range(128, 0, 0),
        lambda: key_group_range(128, 129, 0),
        lambda: key_group_range(0, 1, 0),
        lambda: key_group_range(128, 4, 4),
        lambda: key_group_range(128, 4, -1),
        lambda: operator_index_for_key_group(128, 128, 4),
        lambda: key_group_of("k", 0),
        lambda: key_group_of(1 << 64, 128),
        lambda: key_group_of(object(), 128),  # type: ignore[arg-type]
    ],
)
def test_bad_arguments_raise_clear_errors(call) -> None:
    with pytest.raises(DataplaneError, match="must|cannot"):
        call()


def test_known_spark_values() -> None:
    # SELECT hash(''), hash('abcd'), hash(1L), hash(true) on Spark
    assert spark_hash("") == 142593372
    assert spark_hash("abcd") == -396302900
    assert spark_hash(1) == -1712319331
    assert spark_hash(None) == 42
    assert spark_hash(-0.0) == spark_hash(0.0)


def _random_strings(rng: random.Random, n: int) -> list[str]:
    alphabet = "abcXYZ019 _-é߀中文😀\u0000\u07ff\uffff"
    out = ["", "a", "ab", "abc", "abcd", "é", "€", "😀", "中文字"]
    while len(out) < n:
        out.append("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 20))))
    return out


def _random_longs(rng: random.Random, n: int) -> list[int]:
    out = [0, 1, -1, 2**31 - 1, -(2**31), 2**31, 2**32, -(2**32), 2**63 - 1, -(2**63)]
    while len(out) < n:
        out.append(
            rng.choice([rng.randint(-(2**63), 2**63 - 1), rng.randint(-1000, 1000), rng.randint(-(2**33), 2**33)])
        )
    return out


def test_key_group_of_equals_spark(spark) -> None:
    from pyspark.sql import functions as F

    rng = random.Random(20240601)
    n = 2000
    strings, longs = _random_strings(rng, n), _random_longs(rng, n)
    doubles = [0.0, -0.0, 1.5, -2.25, float("inf"), float("-inf"), float("nan")]
    doubles += [rng.uniform(-1e12, 1e12) for _ in range(n - len(doubles))]
    bools = [rng.random() < 0.5 for _ in range(n)]
    rows = list(zip(range(n), strings, longs, doubles, bools))
    df = spark.createDataFrame(rows, "i bigint, s string, l bigint, d double, b boolean")
    got = df.select(
        "i",
        F.hash("s").alias("hs"),
        F.hash("l").alias("hl"),
        F.hash("d").alias("hd"),
        F.hash("b").alias("hb"),
        key_group_column("s", 128).alias("kgs"),
        key_group_column("l", 7).alias("kgl"),
        F.hash(F.lit(None).cast("string")).alias("hnull"),
    ).collect()
    assert len(got) == n
    for r in got:
        _, s, lv, d, b = rows[r["i"]]
        assert (r["hs"], r["hl"], r["hd"], r["hb"]) == (spark_hash(s), spark_hash(lv), spark_hash(d), spark_hash(b)), (
            rows[r["i"]]
        )
        assert r["kgs"] == key_group_of(s, 128)
        assert r["kgl"] == key_group_of(lv, 7)
        assert r["hnull"] == spark_hash(None)
