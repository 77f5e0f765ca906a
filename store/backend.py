"""The seam between Sluice's log and the server that stores it.

Everything in ``store/`` above this module (the event log, consumers, outbox delivery, the
lease, read models, blobs, queryable state) talks to a :class:`Backend`: a small set of
Redis commands with Redis's semantics, plus Sluice's scripts called by name. Two backends
implement it:

* :class:`~sluice.store.redis_backend.RedisBackend`: a real Redis (or Valkey) through
  redis-py; the scripts are the Lua in :mod:`~sluice.store.scripts`. What every process runs.
* :class:`~sluice.store.memory.MemoryBackend`: one process's connection to an in-memory
  store with the same semantics, for the deterministic simulation (the only non-Redis
  store Sluice allows). Its scripts are Python ports of the Lua, one atomic function each.

Both pass the same contract tests (``tests/store/contract.py``), which is what makes a
result of the simulation count for Redis.

Errors: a server that cannot be reached raises :class:`~sluice.errors.RedisUnavailable`;
a script that answers with an error raises :class:`ScriptFailed` with the error's text
(the log turns the ones it expects into specific errors, e.g. ``StaleEpoch``).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sluice.errors import NoGroup, ScriptFailed

__all__ = [
    "Backend",
    "Delegating",
    "Fields",
    "RawEntry",
    "GroupState",
    "ScriptCall",
    "ScriptFailed",
    "NoGroup",
    "SCRIPTS",
]

_T = TypeVar("_T")

Fields = dict[bytes, bytes]
"""A stream entry's fields as the server returns them."""

RawEntry = tuple[str, Fields]
"""(entry id, fields) of one stream entry."""

ScriptCall = tuple[str, Sequence[str], Sequence[Any]]
"""One script to run: (name, keys, args)."""

SCRIPTS = (
    "commit",
    "fence",
    "dead_letter",
    "deliver",
    "advance_cursor",
    "lease_acquire",
    "lease_renew",
    "lease_release",
    "project",
    "snapshot",
    "set_aside",
)
"""The scripts a backend runs by name (see store/scripts.py for what each does)."""


@dataclass(frozen=True, slots=True)
class GroupState:
    """What ``XINFO GROUPS`` and ``XPENDING`` say of one consumer group."""

    last_delivered: str
    pending: int
    min_pending: str | None


class Backend(abc.ABC):
    """Redis commands Sluice uses, with Redis's semantics; every method may raise
    RedisUnavailable. Stream entry ids are strings ``"<ms>-<seq>"``."""

    # --- the server ---------------------------------------------------------------------

    @abc.abstractmethod
    def server_id(self) -> str:
        """The server's run id: it changes whenever the server restarts (and may have lost
        the writes it had not yet made durable)."""

    @abc.abstractmethod
    def time_ms(self) -> int:
        """The server's clock, in milliseconds."""

    @abc.abstractmethod
    def describe(self) -> str:
        """Where this backend's data lives, for messages (a URL without its password)."""

    def address(self) -> str | None:
        """The URL other processes use to reach this server (None: not reachable from outside)."""
        return None

    def durable(self) -> bool:
        """Whether a write the server acknowledged survives a crash (AOF with ``appendfsync
        always``). False when unknown: a restart may then have lost the last writes."""
        return False

    def close(self) -> None:  # noqa: B027 (optional: most backends hold nothing to release)
        """Release connections."""

    # --- strings and hashes -------------------------------------------------------------

    @abc.abstractmethod
    def get(self, key: str) -> bytes | None: ...

    @abc.abstractmethod
    def set(self, key: str, value: bytes, *, nx: bool = False) -> bool: ...

    @abc.abstractmethod
    def exists(self, *keys: str) -> int: ...

    @abc.abstractmethod
    def delete(self, *keys: str) -> int: ...

    @abc.abstractmethod
    def hget(self, key: str, field: str) -> bytes | None: ...

    @abc.abstractmethod
    def hgetall(self, key: str) -> dict[bytes, bytes]: ...

    @abc.abstractmethod
    def hkeys(self, key: str) -> list[bytes]: ...

    @abc.abstractmethod
    def hset(self, key: str, mapping: Mapping[str, bytes]) -> int: ...

    @abc.abstractmethod
    def hdel(self, key: str, *fields: str) -> int:
        """Remove ``fields`` of the hash ``key``; how many were there."""

    @abc.abstractmethod
    def get_and_hgetall(self, key: str, hash_key: str) -> tuple[bytes | None, dict[bytes, bytes]]:
        """GET ``key`` and HGETALL ``hash_key`` as of one moment (a read model and its position)."""

    @abc.abstractmethod
    def hgetall_with_ttl(self, key: str) -> tuple[dict[bytes, bytes], int]:
        """HGETALL and PTTL of one key as of one moment (the leadership lease)."""

    # --- streams ------------------------------------------------------------------------

    @abc.abstractmethod
    def xadd(self, stream: str, fields: Mapping[bytes, bytes], *, maxlen: int | None = None) -> str:
        """Append an entry with a new id (``maxlen``: trim to about that many entries)."""

    @abc.abstractmethod
    def xadd_many(self, items: Sequence[tuple[str, Mapping[bytes, bytes]]]) -> list[str]:
        """Append several entries, in order, in one round trip, as one transaction: a reader
        sees all of them or none (a key that is not a stream refuses its own: PartlyAppended)."""

    @abc.abstractmethod
    def xrange(self, stream: str, after: str | None, count: int) -> list[RawEntry]:
        """Up to ``count`` entries with ids greater than ``after`` (None: from the start)."""

    @abc.abstractmethod
    def last_id(self, stream: str) -> str | None: ...

    @abc.abstractmethod
    def xlen(self, stream: str) -> int: ...

    @abc.abstractmethod
    def xread(self, positions: Mapping[str, str], *, count: int, block_ms: int | None) -> list[tuple[str, str, Fields]]:
        """Entries after each stream's position (blocking up to ``block_ms`` when there are
        none; None or 0: don't block), as (stream, entry id, fields) in per-stream order."""

    @abc.abstractmethod
    def xtrim_minid(self, stream: str, minid: str) -> int:
        """Remove the entries with ids below ``minid``; how many went."""

    @abc.abstractmethod
    def scan_streams(self, pattern: str) -> list[str]:
        """Names of the streams matching a glob pattern."""

    @abc.abstractmethod
    def scan_keys(self, pattern: str) -> list[str]:
        """Names of the keys of any kind matching a glob pattern."""

    # --- consumer groups ----------------------------------------------------------------

    @abc.abstractmethod
    def group_create(self, stream: str, group: str, start: str) -> None:
        """Create ``group`` on ``stream`` (and the stream) delivering after ``start``
        (``"0"``: from the beginning, ``"$"``: only new entries); nothing if it exists."""

    @abc.abstractmethod
    def group_setid(self, stream: str, group: str, start: str) -> None:
        """Move the group's last-delivered id (``"$"``: the stream's end)."""

    @abc.abstractmethod
    def group_state(self, stream: str, group: str) -> GroupState | None:
        """The group's last-delivered id and pending entries (None: no such group or stream)."""

    @abc.abstractmethod
    def xreadgroup(
        self,
        group: str,
        consumer: str,
        streams: Mapping[str, str],
        *,
        count: int,
        block_ms: int | None,
        ack: Mapping[str, Sequence[str]] | None = None,
    ) -> list[tuple[str, str, Fields | None]]:
        """XREADGROUP: for position ``">"`` new entries (they become pending for
        ``consumer``), for an id this consumer's pending entries after it (fields None for
        an entry deleted since). Raises NoGroup when a group is missing. ``ack``: entries
        (by stream) the group acknowledges first, in the same round trip."""

    @abc.abstractmethod
    def xreadgroup_sole(
        self,
        group: str,
        consumer: str,
        streams: Mapping[str, str],
        *,
        count: int,
        block_ms: int | None,
        ack: Mapping[str, Sequence[str]] | None = None,
    ) -> tuple[list[tuple[str, str, Fields | None]], dict[str, int]]:
        """``xreadgroup`` by the group's sole rightful consumer (the leader), with, from the
        same round trip and after the read, how many entries *other* consumers hold pending
        on each stream (only streams where some do). Another consumer's pending entries were
        read by a deposed leader: before this read (then they precede what it returned) or
        after it (then they follow it); either way the caller takes them over now, so that
        no entry is decided after a later one of the same stream."""

    @abc.abstractmethod
    def xautoclaim(
        self, stream: str, group: str, consumer: str, *, min_idle_ms: int, start: str, count: int
    ) -> tuple[str, list[tuple[str, Fields | None]]]:
        """XAUTOCLAIM: take over entries pending for at least ``min_idle_ms`` from ``start``;
        returns (next start, "0-0" when done; the entries, fields None when deleted)."""

    @abc.abstractmethod
    def xack(self, stream: str, group: str, ids: Sequence[str]) -> int: ...

    # --- scripts ------------------------------------------------------------------------

    @abc.abstractmethod
    def script(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run one of :data:`SCRIPTS` atomically. Replies have Redis's shapes (bytes,
        ints, lists); an error reply raises ScriptFailed."""

    @abc.abstractmethod
    def script_many(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """Run several of :data:`SCRIPTS`, each ``(name, keys, args)``, in one round trip
        (a pipeline: each script is atomic, the batch is not). Returns one reply per call, in
        order; a call answered with an error reply gives a ScriptFailed *in its place* (not
        raised) and the calls after it still run. A call the server refused because it had
        lost its script (a restart, ``SCRIPT FLUSH``) runs again after the others. Raises
        RedisUnavailable (the calls may then have run or not, any of them)."""


class Delegating(Backend):
    """A backend that passes every call to ``inner`` through ``around(name, call)``: the
    seam for fault injection (a call that fails before or after it took effect) and for
    tests that interleave two processes at an exact point."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.appending: Mapping[bytes, bytes] | None = None
        """The fields an ``xadd`` in progress appends (for an ``around`` that looks at them)."""
        self.scripting: tuple[str, Sequence[str], Sequence[Any]] | None = None
        """The script in progress: (name, keys, args)."""

    def around(self, name: str, call: Callable[[], _T]) -> _T:
        """Run ``call()`` (the inner backend's method ``name``); override to intervene."""
        return call()

    def server_id(self) -> str:
        return self.around("server_id", self.inner.server_id)

    def time_ms(self) -> int:
        return self.around("time_ms", self.inner.time_ms)

    def describe(self) -> str:
        return self.inner.describe()

    def durable(self) -> bool:
        return self.around("durable", self.inner.durable)

    def address(self) -> str | None:
        return self.inner.address()

    def close(self) -> None:
        self.inner.close()

    def get(self, key: str) -> bytes | None:
        return self.around("get", lambda: self.inner.get(key))

    def set(self, key: str, value: bytes, *, nx: bool = False) -> bool:
        return self.around("set", lambda: self.inner.set(key, value, nx=nx))

    def exists(self, *keys: str) -> int:
        return self.around("exists", lambda: self.inner.exists(*keys))

    def delete(self, *keys: str) -> int:
        return self.around("delete", lambda: self.inner.delete(*keys))

    def hget(self, key: str, field: str) -> bytes | None:
        return self.around("hget", lambda: self.inner.hget(key, field))

    def hgetall(self, key: str) -> dict[bytes, bytes]:
        return self.around("hgetall", lambda: self.inner.hgetall(key))

    def hkeys(self, key: str) -> list[bytes]:
        return self.around("hkeys", lambda: self.inner.hkeys(key))

    def hset(self, key: str, mapping: Mapping[str, bytes]) -> int:
        return self.around("hset", lambda: self.inner.hset(key, mapping))

    def hdel(self, key: str, *fields: str) -> int:
        return self.around("hdel", lambda: self.inner.hdel(key, *fields))

    def get_and_hgetall(self, key: str, hash_key: str) -> tuple[bytes | None, dict[bytes, bytes]]:
        return self.around("get_and_hgetall", lambda: self.inner.get_and_hgetall(key, hash_key))

    def hgetall_with_ttl(self, key: str) -> tuple[dict[bytes, bytes], int]:
        return self.around("hgetall_with_ttl", lambda: self.inner.hgetall_with_ttl(key))

    def xadd(self, stream: str, fields: Mapping[bytes, bytes], *, maxlen: int | None = None) -> str:
        self.appending = fields  # what the call appends, for an ``around`` that looks at it
        return self.around("xadd", lambda: self.inner.xadd(stream, fields, maxlen=maxlen))

    def xadd_many(self, items: Sequence[tuple[str, Mapping[bytes, bytes]]]) -> list[str]:
        return self.around("xadd_many", lambda: self.inner.xadd_many(items))

    def xrange(self, stream: str, after: str | None, count: int) -> list[RawEntry]:
        return self.around("xrange", lambda: self.inner.xrange(stream, after, count))

    def last_id(self, stream: str) -> str | None:
        return self.around("last_id", lambda: self.inner.last_id(stream))

    def xlen(self, stream: str) -> int:
        return self.around("xlen", lambda: self.inner.xlen(stream))

    def xread(self, positions: Mapping[str, str], *, count: int, block_ms: int | None) -> list[tuple[str, str, Fields]]:
        return self.around("xread", lambda: self.inner.xread(positions, count=count, block_ms=block_ms))

    def xtrim_minid(self, stream: str, minid: str) -> int:
        return self.around("xtrim_minid", lambda: self.inner.xtrim_minid(stream, minid))

    def scan_streams(self, pattern: str) -> list[str]:
        return self.around("scan_streams", lambda: self.inner.scan_streams(pattern))

    def scan_keys(self, pattern: str) -> list[str]:
        return self.around("scan_keys", lambda: self.inner.scan_keys(pattern))

    def group_create(self, stream: str, group: str, start: str) -> None:
        self.around("group_create", lambda: self.inner.group_create(stream, group, start))

    def group_setid(self, stream: str, group: str, start: str) -> None:
        self.around("group_setid", lambda: self.inner.group_setid(stream, group, start))

    def group_state(self, stream: str, group: str) -> GroupState | None:
        return self.around("group_state", lambda: self.inner.group_state(stream, group))

    def xreadgroup(
        self,
        group: str,
        consumer: str,
        streams: Mapping[str, str],
        *,
        count: int,
        block_ms: int | None,
        ack: Mapping[str, Sequence[str]] | None = None,
    ) -> list[tuple[str, str, Fields | None]]:
        return self.around(
            "xreadgroup",
            lambda: self.inner.xreadgroup(group, consumer, streams, count=count, block_ms=block_ms, ack=ack),
        )

    def xreadgroup_sole(
        self,
        group: str,
        consumer: str,
        streams: Mapping[str, str],
        *,
        count: int,
        block_ms: int | None,
        ack: Mapping[str, Sequence[str]] | None = None,
    ) -> tuple[list[tuple[str, str, Fields | None]], dict[str, int]]:
        return self.around(
            "xreadgroup",
            lambda: self.inner.xreadgroup_sole(group, consumer, streams, count=count, block_ms=block_ms, ack=ack),
        )

    def xautoclaim(
        self, stream: str, group: str, consumer: str, *, min_idle_ms: int, start: str, count: int
    ) -> tuple[str, list[tuple[str, Fields | None]]]:
        return self.around(
            "xautoclaim",
            lambda: self.inner.xautoclaim(stream, group, consumer, min_idle_ms=min_idle_ms, start=start, count=count),
        )

    def xack(self, stream: str, group: str, ids: Sequence[str]) -> int:
        return self.around("xack", lambda: self.inner.xack(stream, group, ids))

    def script(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        self.scripting = (name, keys, args)  # the script in progress, for an ``around`` that looks at it
        return self.around("script:" + name, lambda: self.inner.script(name, keys, args))

    def script_many(self, calls: Sequence[ScriptCall]) -> list[Any]:
        # One call for the whole batch: a fault strikes all of it (before or after it ran).
        return self.around("script_many", lambda: self.inner.script_many(calls))
