"""A task publishes its per-key result as queryable state (runs inside the RQ worker).

The result's rows go, keyed by the vertex's input key, into one Redis hash for this attempt
(``KvStates.write``, pipelined in chunks; rows travel from Spark as Arrow batches), then the
attempt registers it for its key-group range with ``NotifyKvStateRegistered`` to the job's
inbox, before the task reports FINISHED (the same process appends both, so in that order).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson

from sluice.events import Envelope, KeyGroupRange, NotifyKvStateRegistered, TaskDeploymentDescriptor
from sluice.services.common.shell import new_id, now_ms
from sluice.services.dataplane.errors import SchemaError
from sluice.services.dataplane.keygroups import key_group_range
from sluice.store import EventLog, KvStates

from .codec import key_field, state_id

__all__ = ["publish"]


def publish(log: EventLog, d: TaskDeploymentDescriptor, df: Any, address: str) -> int:
    """Write ``df`` (the vertex's result) as the attempt's state and register it; returns
    the number of keys."""
    q = d.queryable
    if q is None:
        raise ValueError(f"{d.execution_id} publishes no queryable state")
    name, key = q.name, q.key
    columns = list(df.columns)
    if not key or key not in columns:
        raise SchemaError(
            f"vertex {d.vertex!r} publishes queryable state {name!r} keyed by its input key {key!r}, but its "
            f"result has no such column (columns: {', '.join(columns) or 'none'}); keep the key column in the result"
        )
    job_id, eid = d.job_id, d.execution_id
    sid = state_id(job_id, name, eid)
    n = KvStates(log.backend, log.keys).write(
        job_id, sid, _items(df, key), {"name": name, "execution_id": eid, "written_at": now_ms()}
    )
    start, end = key_group_range(d.max_parallelism, d.parallelism, d.subtask)
    msg = NotifyKvStateRegistered(job_id, d.vertex, KeyGroupRange(start, end), name, sid, address, eid)
    log.append(log.keys.inbox(log.keys.job(job_id)), Envelope(msg, new_id(), 0, now_ms(), job_id))
    return n


def _items(df: Any, key: str) -> Iterator[tuple[str, bytes]]:
    table = df.toArrow() if hasattr(df, "toArrow") else None
    if table is None:  # an older PySpark: row by row
        for row in df.toLocalIterator():
            value = row.asDict(recursive=True)
            if value[key] is not None:
                yield key_field(value[key]), orjson.dumps(value, default=str)
        return
    for batch in table.to_batches():
        for value in batch.to_pylist():
            if value[key] is not None:
                yield key_field(value[key]), orjson.dumps(value, default=str)
