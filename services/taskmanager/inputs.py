"""A task's inputs, as its transform gets them: one DataFrame per input edge, in the order
the job declared them.

* A forward input is its producer's subtask i partition.
* A keyed input is every producer subtask's rows of this subtask's key groups. Two keyed
  inputs of one vertex (a join's sides) are co-partitioned: the same hash (Spark's
  Murmur3, ``keygroups``) into the same number of key groups (validation sees to it), so
  a key's rows from both sides are read by one subtask. The hash is of the key column's
  value as its type stands, and an int hashes otherwise than a long: the key columns of
  the inputs must have one type, which is checked here, before the transform runs.
* A broadcast input is all of its producer's partitions; before the task is deployed the
  TaskManager checks that they hold no more than the job's broadcast limit
  (``broadcast_problem``), failing the job at once (no restart) when they do.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any, cast

from sluice.errors import BroadcastTooLarge, DataplaneError, SchemaError
from sluice.events import TaskDeploymentDescriptor
from sluice.services.jobs.validate import size_text

__all__ = ["read_task_inputs", "broadcast_problem", "check_key_types"]


def read_task_inputs(spark: Any, d: TaskDeploymentDescriptor, shared: Callable[[Any], Any]) -> list[Any]:
    """One DataFrame per input of ``d`` (``shared``: the task's share of the Spark server)."""
    from sluice.services.dataplane import exchange

    frames = [
        shared(
            exchange.read_inputs(
                spark,
                inp.partition_paths(),
                # key_groups is [first, last]; read_inputs checks that it is
                key_groups=cast("tuple[int, int]", tuple(inp.key_groups)) if inp.key_groups else None,
            )
        )
        for inp in d.inputs
    ]
    check_key_types(d, frames)
    return frames


def check_key_types(d: TaskDeploymentDescriptor, frames: list[Any]) -> None:
    """The keyed inputs of a task of several of them have key columns of one type (else equal
    keys would not meet: Spark's hash of an int differs from that of the same long)."""
    keyed = [(inp, df) for inp, df in zip(d.inputs, frames) if inp.key_groups is not None and inp.key]
    if len(keyed) < 2:
        return
    types = []
    for inp, df in keyed:
        field = next((f for f in df.schema.fields if f.name == inp.key), None)
        if field is None:
            raise SchemaError(
                f"vertex {d.vertex!r} reads {inp.vertex!r} keyed by {inp.key!r}, but its rows have no column "
                f"{inp.key!r} (columns: {', '.join(df.schema.fieldNames())})"
            )
        types.append((inp, field.dataType))
    first_inp, first_type = types[0]
    for inp, data_type in types[1:]:
        if data_type != first_type:
            raise SchemaError(
                f"vertex {d.vertex!r} joins {first_inp.vertex!r} keyed by {first_inp.key!r} "
                f"({first_type.simpleString()}) with {inp.vertex!r} keyed by {inp.key!r} "
                f"({data_type.simpleString()}): keys of different types hash differently, so equal keys would "
                f"land on different subtasks; cast one side's key to the other's type before the join "
                f"(F.col({inp.key!r}).cast({first_type.simpleString()!r}))"
            )


_SIZES: OrderedDict[str, int] = OrderedDict()
"""Bytes published at a partition path, remembered: a path names one attempt's partition,
which never changes once produced, and every consumer subtask deployed here asks again."""
_REMEMBERED = 10_000


def _published(path: str) -> int:
    from sluice.services.dataplane import exchange

    if path not in _SIZES:
        _SIZES[path] = exchange.published_bytes(path)
        while len(_SIZES) > _REMEMBERED:
            _SIZES.popitem(last=False)
    return _SIZES[path]


def broadcast_problem(d: TaskDeploymentDescriptor) -> BroadcastTooLarge | None:
    """The first broadcast input of ``d`` whose producer published more than its limit, as
    the error to fail the job with (None: all fit). Reads the sizes of the producer's files
    (once a partition); a partition that cannot be listed is left to the task's own read,
    which says what is wrong with it."""
    for inp in d.inputs:
        limit = inp.broadcast_limit
        if limit is None:
            continue
        try:
            size = sum(_published(path) for path in inp.partition_paths())
        except DataplaneError:
            continue
        if size > limit:
            return BroadcastTooLarge(
                f"broadcast input {inp.vertex!r} of vertex {d.vertex!r} published {size_text(size)}, "
                f"above the job's broadcast limit of {size_text(limit)}: every subtask of {d.vertex!r} "
                "would read it whole; key both sides instead (a.key_by(k).join(b.key_by(k), ...)), or raise the "
                "limit with Job(..., broadcast_limit_bytes=N)"
            )
    return None
