"""What the metrics endpoints read from Redis at scrape time: each inbox's lag and pending
entries for a consumer group, and how many entries the dead-letter streams hold.

On a real Redis each is one round trip however many streams are asked about (a pipeline),
on a Redis Cluster one per master (store/fanout.py); on any other backend (the
simulation's) it goes through the Backend's own calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .cluster_backend import ClusterBackend
from .fanout import pipelined
from .log import EventLog
from .redis_backend import RedisBackend

__all__ = ["InboxReading", "inbox_readings", "dead_letter_counts", "LAG_COUNTED_UP_TO"]

LAG_COUNTED_UP_TO = 1000
"""When Redis cannot say a group's lag itself (``XINFO GROUPS`` answers nil after the group
was moved with ``XGROUP SETID``), the entries after its last delivered one are counted, up
to this many (a scrape must stay cheap)."""


@dataclass(frozen=True, slots=True)
class InboxReading:
    """One inbox as a consumer group sees it."""

    stream: str
    lag: int
    """Entries not yet delivered to the group."""
    pending: int
    """Entries delivered and not yet acknowledged."""


def inbox_readings(log: EventLog, streams: Sequence[str], group: str) -> list[InboxReading]:
    """Lag and pending entries of ``group`` on each of ``streams`` (a stream without the
    group, or that does not exist, is left out)."""
    backend = log.backend
    if not streams:
        return []
    if not isinstance(backend, (RedisBackend, ClusterBackend)):
        return _generic(log, streams, group)
    what = "reading the consumer groups of " + ", ".join(streams[:3])
    answers = pipelined(log, what, streams, lambda pipe, i: pipe.xinfo_groups(streams[i]))
    out = []
    for stream, groups in zip(streams, answers):
        if isinstance(groups, Exception):
            continue  # no such stream
        mine = [g for g in groups if _s(g["name"]) == group]
        if not mine:
            continue
        g = mine[0]
        lag = g.get("lag")
        if lag is None:
            lag = _count_after(log, stream, _s(g["last-delivered-id"]))
        out.append(InboxReading(stream, int(lag), int(g.get("pending") or 0)))
    return out


def _generic(log: EventLog, streams: Sequence[str], group: str) -> list[InboxReading]:
    out = []
    for s in streams:
        state = log.backend.group_state(s, group)
        if state is not None:
            out.append(InboxReading(s, _count_after(log, s, state.last_delivered), state.pending))
    return out


def _count_after(log: EventLog, stream: str, entry_id: str) -> int:
    return len(log.backend.xrange(stream, entry_id, LAG_COUNTED_UP_TO))


def dead_letter_counts(log: EventLog, tags: Sequence[str]) -> dict[str, int]:
    """How many entries each tag's dead-letter stream holds (0: none, or no stream)."""
    keys = [log.keys.dead(t) for t in tags]
    backend = log.backend
    if not isinstance(backend, (RedisBackend, ClusterBackend)):
        return {t: backend.xlen(k) for t, k in zip(tags, keys)}
    lengths = pipelined(log, "reading the dead-letter streams", keys, lambda pipe, i: pipe.xlen(keys[i]))
    for n in lengths:
        if isinstance(n, Exception):
            raise n
    return {t: int(n) for t, n in zip(tags, lengths)}


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
