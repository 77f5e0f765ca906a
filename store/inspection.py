"""What ``sluice inspect`` and the dashboard read from Redis that the services never need:
a stream's memory, its consumer groups (lag, pending entries, the oldest pending one),
entries read backwards from a moment, one entry by id, and re-driving a dead letter.

Each read over several streams is one round trip (a pipeline) per server: one on a single
Redis, one per master on a Redis Cluster (store/fanout.py). These need a real Redis
(``MEMORY USAGE`` and ``XINFO`` have no counterpart in the simulation's backend): on any
other backend they raise StoreError saying so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import orjson
import redis

from sluice.errors import StoreError

from .fanout import client_for, clients, pipelined
from .keys import tag_of
from .log import EventLog, entry_order
from .redis_backend import translate_errors

__all__ = [
    "GroupInfo",
    "stream_summaries",
    "consumer_groups",
    "entries_before",
    "entry",
    "redrive_entry",
    "DEAD_FIELD_PREFIX",
    "projected_row",
    "count_after",
    "server_footprint",
]

DEAD_FIELD_PREFIX = b"field:"
"""A dead letter keeps the parked entry's own fields under this prefix (store/scripts.py)."""


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """One consumer group of one stream."""

    stream: str
    name: str
    consumers: int
    pending: int
    lag: int | None
    """Entries not yet delivered to the group (None: Redis cannot say, after XGROUP SETID)."""
    last_delivered: str
    oldest_pending: str | None
    """The id of the oldest entry delivered and not acknowledged."""
    oldest_pending_idle_ms: int | None
    """How long since it was last delivered."""


def _redis(log: EventLog, what: str, key: str | None = None) -> redis.Redis:
    """The client of the server holding ``key`` (a cluster's master serving its slot)."""
    return client_for(log, what, key)


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def server_footprint(log: EventLog) -> tuple[int, int, int, int]:
    """The server's ``used_memory`` (bytes), its key count (``DBSIZE``), how many of those
    keys are Sluice's under this prefix (the rest: RQ's, ``{<p>:rq}:…``, and others') and the bytes those take
    (``MEMORY USAGE`` summed: Redis's estimate, without the server's own overhead)."""
    what = "reading the server's memory"
    memory = size = n = used = 0
    rq = log.keys.rq_prefix.encode()  # RQ's keys are under the prefix too: counted with the rest
    with translate_errors(what):
        for client, _ in clients(log, what):  # (a cluster: the sums over its masters)
            pipe = client.pipeline(transaction=False)
            pipe.info("memory")
            pipe.dbsize()
            info, keys = pipe.execute()
            ours = [k for k in client.scan_iter(match=log.keys.pattern, count=1000) if not k.startswith(rq)]
            pipe = client.pipeline(transaction=False)
            for key in ours:
                pipe.memory_usage(key, samples=0)
            used += sum(int(u) for u in pipe.execute(raise_on_error=False) if isinstance(u, int))
            memory, size, n = memory + int(info["used_memory"]), size + int(keys), n + len(ours)
    return memory, size, n, used


def stream_summaries(log: EventLog, streams: Sequence[str]) -> dict[str, tuple[int, int | None, str | None]]:
    """Each stream's (length, bytes it takes in Redis, its last entry id), in one round
    trip. Memory is ``MEMORY USAGE`` (Redis's estimate from samples; None when the server
    refuses the command); a stream gone meanwhile reads (0, None, None)."""
    if not streams:
        return {}

    def queue(pipe: Any, i: int) -> None:
        s = streams[i]
        pipe.xlen(s)
        pipe.memory_usage(s)
        pipe.xrevrange(s, count=1)

    answers = pipelined(log, "reading the streams' sizes", streams, queue, per_key=3)
    out: dict[str, tuple[int, int | None, str | None]] = {}
    for i, s in enumerate(streams):
        length, memory, last = answers[3 * i : 3 * i + 3]
        out[s] = (
            int(length) if isinstance(length, int) else 0,
            int(memory) if isinstance(memory, int) else None,
            _s(last[0][0]) if isinstance(last, list) and last else None,
        )
    return out


def consumer_groups(log: EventLog, streams: Sequence[str]) -> list[GroupInfo]:
    """Every consumer group of each stream, with its oldest pending entry (two round trips)."""
    if not streams:
        return []
    what = "reading the consumer groups"
    answers = pipelined(log, what, streams, lambda pipe, i: pipe.xinfo_groups(streams[i]))
    found: list[tuple[str, dict[str, Any]]] = []
    for s, groups in zip(streams, answers):
        if isinstance(groups, Exception):
            continue  # not a stream (any more)
        found += [(s, g) for g in groups]
    # (one pipeline per server again: each group's stream, as many times as it has groups)
    oldest = pipelined(
        log,
        what,
        [s for s, _ in found],
        lambda pipe, i: pipe.xpending_range(found[i][0], _s(found[i][1]["name"]), min="-", max="+", count=1),
    )
    out = []
    for (s, g), first in zip(found, oldest):
        head = first[0] if isinstance(first, list) and first else None
        lag = g.get("lag")
        out.append(
            GroupInfo(
                stream=s,
                name=_s(g["name"]),
                consumers=int(g.get("consumers") or 0),
                pending=int(g.get("pending") or 0),
                lag=int(lag) if lag is not None else None,
                last_delivered=_s(g.get("last-delivered-id") or b"0-0"),
                oldest_pending=_s(head["message_id"]) if head else None,
                oldest_pending_idle_ms=int(head["time_since_delivered"]) if head else None,
            )
        )
    return out


def entries_before(
    log: EventLog, stream: str, until: str | None, count: int, *, since: str = "-"
) -> list[tuple[str, dict[bytes, bytes]]]:
    """Up to ``count`` entries of ``stream`` at or before entry id ``until`` (None: the
    end) and at or after ``since`` (an entry id, or ``-``: the start), newest first."""
    client = _redis(log, "reading a stream backwards", stream)
    with translate_errors(f"reading {stream} backwards"):
        rows = cast(
            "list[tuple[bytes, dict[bytes, bytes]]]", client.xrevrange(stream, max=until or "+", min=since, count=count)
        )
    return [(_s(i), dict(f)) for i, f in rows]


def newest(
    log: EventLog, streams: Sequence[str], until: str | None, count: int, *, chunk: int = 64
) -> tuple[list[tuple[str, str, dict[bytes, bytes]]], dict[str, str | None]]:
    """The ``count`` newest entries at or before ``until`` (None: the end) across
    ``streams``, oldest first, as (stream, id, fields); and each stream's newest entry id
    then (None: empty). One pipelined round trip for the newest ids, then the streams
    newest first, ``chunk`` at a time, only until no other stream can hold a newer entry:
    about ``count`` entries read whatever the number of streams. Entries with one id in
    two streams are in the order of the streams' names."""
    last: dict[str, str | None] = {}
    if not streams:
        return [], last
    what = "reading the newest entries"
    top = until or "+"
    with translate_errors(what):
        heads = pipelined(log, what, streams, lambda pipe, i: pipe.xrevrange(streams[i], max=top, count=1))
        for s, rows in zip(streams, heads):
            last[s] = _s(rows[0][0]) if isinstance(rows, list) and rows else None
        held = {s: entry_order(i) for s, i in last.items() if i is not None}
        order = sorted(held, key=held.__getitem__, reverse=True)
        found: list[tuple[tuple[int, int], str, str, dict[bytes, bytes]]] = []
        for i in range(0, len(order), chunk):
            group = order[i : i + chunk]
            if count <= 0 or (len(found) >= count and held[group[0]] < found[count - 1][0]):
                break  # every stream left ends before the count-th newest already found
            pages = pipelined(log, what, group, _backwards(group, top, count))
            for s, rows in zip(group, pages):
                if isinstance(rows, Exception):
                    raise rows
                found += [(entry_order(_s(e)), s, _s(e), dict(f)) for e, f in rows]
            found.sort(key=lambda x: (x[0], x[1]), reverse=True)  # ties (one id in two streams): by stream
            del found[count:]
    return [(s, e, f) for _, s, e, f in reversed(found)], last


def _backwards(streams: Sequence[str], top: str, count: int) -> Callable[[Any, int], None]:
    """Queues XREVRANGE of ``streams[i]`` (a ``pipelined`` queue)."""
    return lambda pipe, i: pipe.xrevrange(streams[i], max=top, count=count)


def entry(log: EventLog, stream: str, entry_id: str) -> dict[bytes, bytes] | None:
    """The fields of one entry (None: no such entry)."""
    client = _redis(log, "reading one entry", stream)
    with translate_errors(f"reading {entry_id} of {stream}"):
        try:
            rows = cast(
                "list[tuple[bytes, dict[bytes, bytes]]]", client.xrange(stream, min=entry_id, max=entry_id, count=1)
            )
        except redis.ResponseError as exc:  # not an entry id, or not a stream
            raise StoreError(f"cannot read entry {entry_id!r} of {stream}: {exc}") from exc
    return dict(rows[0][1]) if rows else None


def redrive_entry(log: EventLog, dead: str, entry_id: str, target: str, fields: dict[bytes, bytes]) -> str | None:
    """Append ``fields`` to ``target`` and delete dead letter ``entry_id`` from ``dead``, in
    one transaction (both keys live in one hash tag). The new entry's id, or None when the
    dead letter was gone already (someone re-drove it first: nothing is appended)."""
    if tag_of(dead) != tag_of(target):
        raise StoreError(
            f"dead letter {entry_id} of {dead} names {target}, a stream of another tag: "
            "a dead letter goes back to a stream of its own tag only"
        )
    client = _redis(log, "re-driving a dead letter", dead)
    with translate_errors(f"re-driving {entry_id} of {dead} to {target}"):
        with client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(dead)
                    if not pipe.xrange(dead, min=entry_id, max=entry_id, count=1):
                        pipe.unwatch()
                        return None
                    pipe.multi()
                    pipe.xadd(target, cast("dict[Any, Any]", fields))
                    pipe.xdel(dead, entry_id)
                    new_id, _ = pipe.execute()
                    return _s(new_id)
                except redis.WatchError:
                    continue


def projected_row(log: EventLog, tag: str, table: str, key: str, stream: str) -> tuple[str | None, Any, str | None]:
    """(the position table ``table`` of ``tag`` reflects, its row ``key`` decoded or None,
    the last entry of fact stream ``stream``), read in one transaction: the row is up to date
    when the position is that last entry."""
    client = _redis(log, "reading a projected row", stream)
    with translate_errors(f"reading row {key} of {table} in {tag}"):
        pipe = client.pipeline(transaction=True)
        pipe.get(log.keys.position(tag, table))
        pipe.hget(log.keys.table(tag, table), key)
        pipe.xrevrange(stream, count=1)
        pos, raw, last = pipe.execute()
    return (_s(pos) if pos else None, orjson.loads(raw) if raw else None, _s(last[0][0]) if last else None)


def count_after(log: EventLog, stream: str, entry_id: str, *, page: int = 10_000, limit: int | None = None) -> int:
    """How many entries of ``stream`` come after entry id ``entry_id`` (read a page at a
    time; at most ``limit`` are counted)."""
    client = _redis(log, "counting a stream's entries", stream)
    n, start = 0, "(" + entry_id
    with translate_errors(f"counting the entries of {stream} after {entry_id}"):
        while True:
            want = page if limit is None else min(page, limit - n)
            if want <= 0:
                return n
            rows = cast("list[tuple[bytes, Any]]", client.xrange(stream, min=start, max="+", count=want))
            n += len(rows)
            if len(rows) < want:
                return n
            start = "(" + _s(rows[-1][0])
