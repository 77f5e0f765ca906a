"""Key groups as Flink assigns them, with Spark's hash.

A key maps to a key group ``pmod(hash(key), max_parallelism)`` and key groups map to
subtasks by contiguous ranges (Flink's ``KeyGroupRangeAssignment``), so the same key
always lands on the same subtask for a given parallelism, and rescaling moves whole
key groups. The hash is Spark's ``hash()`` so that a DataFrame column
(``key_group_column``) and a client routing one key (``key_group_of``) agree exactly;
see ``spark_hash`` for which Spark type each Python key type stands for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sluice.services.dataplane.errors import DataplaneError
from sluice.services.dataplane.spark_hash import spark_hash

if TYPE_CHECKING:
    from pyspark.sql import Column

__all__ = [
    "MAX_PARALLELISM_LIMIT",
    "key_group_column",
    "key_group_of",
    "key_group_range",
    "operator_index_for_key_group",
]

MAX_PARALLELISM_LIMIT = 1 << 15
"""Flink's upper bound on max parallelism (``KeyGroupRangeAssignment.UPPER_BOUND_MAX_PARALLELISM``)."""


def _check_max_parallelism(max_parallelism: int) -> None:
    if isinstance(max_parallelism, bool) or not isinstance(max_parallelism, int):
        raise DataplaneError(f"max_parallelism must be an int, got {max_parallelism!r}")
    if not 1 <= max_parallelism <= MAX_PARALLELISM_LIMIT:
        raise DataplaneError(
            f"max_parallelism must be between 1 and {MAX_PARALLELISM_LIMIT}, got {max_parallelism} "
            "(Sluice's default is 128)"
        )


def _check_parallelism(max_parallelism: int, parallelism: int) -> None:
    _check_max_parallelism(max_parallelism)
    if isinstance(parallelism, bool) or not isinstance(parallelism, int) or not 1 <= parallelism <= max_parallelism:
        raise DataplaneError(
            f"parallelism must be an int between 1 and max_parallelism ({max_parallelism}), got {parallelism!r}: "
            "a subtask without a key group would receive no keys"
        )


def key_group_column(col_name: str, max_parallelism: int) -> Column:
    """The key group of column ``col_name``: ``pmod(hash(col), max_parallelism)`` (Spark's Murmur3, seed 42)."""
    from pyspark.sql import functions as F

    _check_max_parallelism(max_parallelism)
    if not isinstance(col_name, str) or not col_name:
        raise DataplaneError(f"the key column must be a non-empty column name, got {col_name!r}")
    return F.pmod(F.hash(F.col(col_name)), F.lit(max_parallelism))


def key_group_of(key: str | int | bool | float | None, max_parallelism: int) -> int:  # noqa: PYI041
    """The key group Spark's ``pmod(hash(key), max_parallelism)`` gives ``key``, without Spark.

    ``int`` keys stand for LongType values (they must fit 64 bits); an IntegerType column
    hashes differently, so keep key columns strings or longs.
    """
    _check_max_parallelism(max_parallelism)
    try:
        return spark_hash(key) % max_parallelism  # Python's % is already Spark's pmod for n > 0
    except (TypeError, OverflowError) as exc:
        raise DataplaneError(f"cannot compute the key group of {key!r}: {exc}") from exc


def key_group_range(max_parallelism: int, parallelism: int, operator_index: int) -> tuple[int, int]:
    """The key groups ``(first, last)`` (both inclusive) of subtask ``operator_index``, as Flink computes them."""
    _check_parallelism(max_parallelism, parallelism)
    if isinstance(operator_index, bool) or not isinstance(operator_index, int) or not 0 <= operator_index < parallelism:
        raise DataplaneError(
            f"operator_index must be an int between 0 and parallelism-1 ({parallelism - 1}), got {operator_index!r}"
        )
    start = (operator_index * max_parallelism + parallelism - 1) // parallelism
    end = ((operator_index + 1) * max_parallelism - 1) // parallelism
    return start, end


def operator_index_for_key_group(key_group: int, max_parallelism: int, parallelism: int) -> int:
    """The subtask whose ``key_group_range`` holds ``key_group`` (Flink's formula)."""
    _check_parallelism(max_parallelism, parallelism)
    if isinstance(key_group, bool) or not isinstance(key_group, int) or not 0 <= key_group < max_parallelism:
        raise DataplaneError(
            f"key_group must be an int between 0 and max_parallelism-1 ({max_parallelism - 1}), got {key_group!r}"
        )
    return key_group * parallelism // max_parallelism
