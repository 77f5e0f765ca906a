"""An in-memory store with Redis's semantics, for the deterministic simulation.

The simulation runs a whole Sluice cluster in one thread: many actors, each with its own
connection, a seeded scheduler and a simulated clock. This module is its Redis:

* :class:`MemoryStore` is the server: keys (strings, hashes, streams with consumer groups
  and pending-entries lists), key expiry, a run id, and the faults a real server has.
* :class:`MemoryBackend` is one process's connection to it: a :class:`~sluice.store.backend.Backend`.

It is worth something only because it behaves like Redis 7 for every command Sluice
uses, and each Lua script of :mod:`~sluice.store.scripts` is ported to one atomic Python
function with the Lua's semantics and reply shapes (bytes where Redis replies bulk
strings, ints, lists; an error reply raises :class:`~sluice.store.backend.ScriptFailed`
with the text redis-py shows). The contract tests (``tests/store/contract.py``) run on
both, and ``tests/store/test_memory_store.py`` runs random calls on both and compares.
What is easy to get wrong, and is done as Redis does it:

* Entry ids are ``<ms>-<seq>`` from the store's clock; the sequence goes up while the
  millisecond does not move, and an id is never below the stream's last id (even if the
  clock goes back, or the entries were trimmed). XADD ``maxlen`` trims exactly (Redis's
  ``~`` trims whole nodes, so Redis may keep more; Sluice passes no ``maxlen``).
* A key expires when the clock is *past* its deadline (alive at the deadline, PTTL 0).
  PEXPIRE with a deadline not in the future deletes the key. SET clears a TTL.
* XREADGROUP with an id re-reads this consumer's pending entries after it and counts one
  more delivery for each (which Redis does not write to its AOF: a restart forgets it);
  an entry deleted while pending comes back with fields None. XAUTOCLAIM drops pending
  entries whose entry was deleted instead of returning them (Redis 7), counts them
  against COUNT, and looks at no more than 10 x COUNT entries.
* A script that fails half-way keeps the writes it made before failing (Redis has no
  rollback either).

Faults, the reason this exists:

* **Lost writes.** Every mutation is recorded as it happens in an append-only list of
  (time, mutation), generated ids and absolute expiry deadlines resolved, like Redis's
  AOF; reads are not recorded. :meth:`MemoryStore.crash` is a kill -9 and a restart: it
  rebuilds the state from the mutations up to a time (or all of them, ``appendfsync
  always``), gives the server a new run id and counts a new generation. Mutations older
  than ``aof_window_ms`` (default 5 s of clock) before the newest are folded into a
  snapshot once the list grows past ``compact_records``, so memory and replay stay
  bounded; losing writes older than that window is not supported (ValueError).
* **Shards.** With ``shards`` > 1 the keys are spread over that many masters by their
  Redis Cluster slot (CRC16 of the hash tag, the slot ranges ``redis-cli --cluster create``
  assigns). Each shard has its own run id and replication id, and :meth:`MemoryStore.failover`
  fails one over: its replica is promoted with that shard's writes up to a time (replication
  is asynchronous) and every other shard's writes. ``server_id`` is then every shard's
  identity with its slot range (``s0@0-5460=<run id>:<replid>,...``, as a cluster's names
  its masters), and a script checks the identity of its key's shard (store/shards.py).
* **Connections.** A connection's first call after a restart raises RedisUnavailable
  (connection reset) unless the store has ``silent_reconnect`` (redis-py's retries
  sometimes hide a reset); while ``store.down`` is True every call raises it.
* Failing a call before or after it takes effect is :class:`~sluice.store.backend.Delegating`'s job.

The store is not thread-safe, and ``block_ms`` is ignored: a read never blocks (the
simulator moves the clock instead).

Public surface::

    MemoryStore(clock, *, seed=0, rng=None, silent_reconnect=False, aof_window_ms=5000,
                compact_records=10000)
        .crash(lose_after_ms=None)      .down   .silent_reconnect   .run_id   .generation
    MemoryStore(..., shards=3)          keys spread over 3 shards by slot (store/shards.py)
        .failover(shard, lose_after_ms=None)   .shard_of(key)   .identity(shard=None)
        .run_ids   .replids   .failovers
        .streams() -> [name]            .entries(stream) -> [(id, fields)]
        .groups(stream) -> {group: last delivered id}
        .pending(stream, group) -> [PendingEntry(id, consumer, delivered_ms, deliveries)]
        .dump() -> the whole state as plain values (to compare stores)
    MemoryBackend(store, name="memory")   a Backend
    CommandError                          a command's error reply (WRONGTYPE, ...)
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, cast

from sluice.errors import CommandError, PartlyAppended, RedisUnavailable, WrongType

from . import scripts
from .backend import Backend, Fields, GroupState, NoGroup, RawEntry, ScriptCall, ScriptFailed
from .shards import SLOTS, identity, keyslot, master_part, matches, shard_of_slot, slot_ranges

__all__ = ["AOF_WINDOW_MS", "CommandError", "MemoryBackend", "MemoryStore", "PendingEntry"]

AOF_WINDOW_MS = 5_000
"""Default for how far back (in clock ms before the newest write) a crash may lose writes."""

_COMPACT_RECORDS = 10_000
"""Default AOF length at which records older than the window go into the snapshot."""

Id = tuple[int, int]
_MAX = (1 << 64) - 1
_WRONGTYPE = "WRONGTYPE Operation against a key holding the wrong kind of value"
_BAD_ID = "Invalid stream ID specified as stream command argument"
_NOT_INT = "value is not an integer or out of range"
_BAD_MAXLEN = "The MAXLEN argument must be >= 0."
_DOLLAR_IN_GROUP = (
    "The $ ID is meaningless in the context of XREADGROUP: you want to read the history of this "
    "consumer by specifying a proper ID, or use the > ID to get new messages. The $ ID would just "
    "return an empty result set."
)
_GT_OUTSIDE_GROUP = "The > ID can be specified only when calling XREADGROUP using the GROUP <group> <consumer> option."


@dataclass(frozen=True, slots=True)
class PendingEntry:
    """One entry of a consumer group's pending-entries list."""

    id: str
    consumer: str
    delivered_ms: int
    """The clock when it was last delivered (its idle time is measured from here)."""
    deliveries: int


# --- the state -----------------------------------------------------------------------------


class _Group:
    __slots__ = ("last", "order", "pel")

    def __init__(self, last: Id) -> None:
        self.last = last
        self.pel: dict[Id, tuple[str, int, int]] = {}
        """Pending entries: id -> (consumer, last delivery ms, delivery count)."""
        self.order: list[Id] = []
        """The pending ids, sorted."""

    def clone(self) -> _Group:
        g = _Group(self.last)
        g.pel = dict(self.pel)
        g.order = list(self.order)
        return g


class _Stream:
    __slots__ = ("fields", "groups", "ids", "last", "sids")

    def __init__(self) -> None:
        self.ids: list[Id] = []
        self.sids: list[str] = []
        self.fields: list[Fields] = []
        self.last: Id = (0, 0)
        self.groups: dict[str, _Group] = {}

    def find(self, entry: Id) -> int:
        """Index of the entry ``entry`` (-1 when it is not in the stream)."""
        ids = self.ids
        i = bisect.bisect_left(ids, entry)
        return i if i < len(ids) and ids[i] == entry else -1

    def clone(self) -> _Stream:
        s = _Stream()
        s.ids, s.sids, s.fields, s.last = list(self.ids), list(self.sids), list(self.fields), self.last
        s.groups = {name: g.clone() for name, g in self.groups.items()}
        return s


Value = bytes | dict[bytes, bytes] | _Stream


class _State:
    __slots__ = ("data", "expires")

    def __init__(self) -> None:
        self.data: dict[str, Value] = {}
        self.expires: dict[str, int] = {}
        """key -> absolute deadline (ms); the key is gone once the clock is past it."""

    def clone(self) -> _State:
        st = _State()
        st.expires = dict(self.expires)
        for key, value in self.data.items():
            if isinstance(value, _Stream):
                value = value.clone()
            elif isinstance(value, dict):
                value = dict(value)
            st.data[key] = value
        return st


# The mutations: pure functions of the state and their arguments, so that replaying the
# recorded ones rebuilds the state exactly. Entry field dicts are shared between the
# live state, the snapshot and the records, and never mutated. A mutation does not check
# the kind of the value it changes: the command that recorded it did (WRONGTYPE), and a
# replay finds the same value there, so the accessors below only tell mypy what it is.


def _hash_at(st: _State, key: str) -> dict[bytes, bytes]:
    return cast("dict[bytes, bytes]", st.data[key])


def _stream_at(st: _State, key: str) -> _Stream:
    return cast(_Stream, st.data[key])


def _op_del(st: _State, key: str) -> None:
    st.data.pop(key, None)
    st.expires.pop(key, None)


def _op_set(st: _State, key: str, value: bytes) -> None:
    st.data[key] = value
    st.expires.pop(key, None)


def _op_setkeep(st: _State, key: str, value: bytes) -> None:
    st.data[key] = value


def _op_hset(st: _State, key: str, mapping: dict[bytes, bytes]) -> None:
    h = cast("dict[bytes, bytes] | None", st.data.get(key))
    if h is None:
        h = st.data[key] = {}
    h.update(mapping)


def _op_hdel(st: _State, key: str, fields: tuple[bytes, ...]) -> None:
    h = _hash_at(st, key)
    for f in fields:
        h.pop(f, None)
    if not h:
        del st.data[key]
        st.expires.pop(key, None)


def _op_pexpireat(st: _State, key: str, deadline: int) -> None:
    st.expires[key] = deadline


def _op_mkstream(st: _State, key: str) -> None:
    st.data[key] = _Stream()


def _op_xadd(st: _State, key: str, entry: Id, sid: str, fields: Fields) -> None:
    s = cast("_Stream | None", st.data.get(key))
    if s is None:
        s = st.data[key] = _Stream()
    s.ids.append(entry)
    s.sids.append(sid)
    s.fields.append(fields)
    s.last = entry


def _op_xtrim(st: _State, key: str, n: int) -> None:
    s = _stream_at(st, key)
    del s.ids[:n], s.sids[:n], s.fields[:n]


def _op_group(st: _State, key: str, group: str, last: Id) -> None:
    _stream_at(st, key).groups[group] = _Group(last)


def _op_setid(st: _State, key: str, group: str, last: Id) -> None:
    _stream_at(st, key).groups[group].last = last


def _op_deliver(st: _State, key: str, group: str, consumer: str, ids: tuple[Id, ...], now: int) -> None:
    """New entries delivered to ``consumer`` (XREADGROUP >): pending, one delivery; an
    entry that was already pending (the group was moved back) changes owner, count 1."""
    g = _stream_at(st, key).groups[group]
    pel, order = g.pel, g.order
    for entry in ids:
        if entry not in pel:
            if not order or entry > order[-1]:
                order.append(entry)
            else:
                bisect.insort(order, entry)
        pel[entry] = (consumer, now, 1)
    g.last = ids[-1]


def _op_touch(st: _State, key: str, group: str, ids: tuple[Id, ...], now: int) -> None:
    """Pending entries read again by their owner: one more delivery, idle from now. (Not
    recorded: Redis does not write it to the AOF, so a restart forgets it.)"""
    pel = _stream_at(st, key).groups[group].pel
    for entry in ids:
        consumer, _, count = pel[entry]
        pel[entry] = (consumer, now, count + 1)


def _op_claim(st: _State, key: str, group: str, claims: tuple[tuple[Id, str, int, int], ...]) -> None:
    """Pending entries taken over (XAUTOCLAIM): (id, consumer, delivery ms, delivery count)
    each, absolute, as Redis writes XCLAIM ... TIME ... RETRYCOUNT ... to its AOF."""
    pel = _stream_at(st, key).groups[group].pel
    for entry, consumer, when, count in claims:
        pel[entry] = (consumer, when, count)


def _op_unpend(st: _State, key: str, group: str, ids: tuple[Id, ...]) -> None:
    g = _stream_at(st, key).groups[group]
    pel, order = g.pel, g.order
    for entry in ids:
        del pel[entry]
        del order[bisect.bisect_left(order, entry)]


Op = Callable[..., None]
Record = tuple[int, Op, tuple[Any, ...]]
_time_of: Callable[[Record], int] = itemgetter(0)


def _replid(run_id: str, failovers: int) -> str:
    """A shard's replication id, from its run id (no draw from the seed's random numbers: a
    store of one shard draws what it always drew)."""
    return hashlib.sha1(f"replid {run_id} {failovers}".encode()).hexdigest()


# --- small helpers -------------------------------------------------------------------------


def _b(value: Any) -> bytes:
    """A value as redis-py sends it (bytes as they are, str UTF-8, numbers as their repr)."""
    if type(value) is bytes:
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bool):
        raise TypeError(f"invalid input of type bool ({value!r}): convert it to bytes, str or a number first")
    if isinstance(value, (int, float)):
        return repr(value).encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"invalid input of type {type(value).__name__}: convert it to bytes, str or a number first")


def _s(value: bytes | str) -> str:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value


def _parse_id(text: str, missing_seq: int = 0) -> Id:
    """A stream id ``ms-seq`` (or ``ms``: sequence ``missing_seq``) as Redis parses it."""
    ms, dash, seq = text.partition("-")
    if not (ms.isdigit() and ms.isascii()) or (dash and not (seq.isdigit() and seq.isascii())):
        raise CommandError(_BAD_ID)
    pair = (int(ms), int(seq) if dash else missing_seq)
    if pair[0] > _MAX or pair[1] > _MAX:
        raise CommandError(_BAD_ID)
    return pair


def _parse_bound(text: str, missing_seq: int = 0) -> Id:
    """An interval's bound as Redis parses it: ``-`` (the least id), ``+`` (the greatest), an
    id (``ms`` alone: sequence ``missing_seq``, 0 for a start and the greatest for an end)."""
    return (0, 0) if text == "-" else (_MAX, _MAX) if text == "+" else _parse_id(text, missing_seq)


def _parse_start(text: str) -> Id:
    """A range start: ``-``, ``+``, an id, or ``(id`` (exclusive)."""
    if text.startswith("("):
        ms, seq = _parse_id(text[1:])
        if (ms, seq) == (_MAX, _MAX):
            raise CommandError("invalid start ID for the interval")
        return (ms, seq + 1) if seq < _MAX else (ms + 1, 0)
    return _parse_bound(text)


def _fmt(entry: Id) -> str:
    return f"{entry[0]}-{entry[1]}"


def _tonumber(value: bytes | None) -> int | float | None:
    """Lua's tonumber on a string (None for false/nil or text that is not a number)."""
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        try:
            return float(value)
        except ValueError:
            return None


def _or(value: bytes | None, default: bytes) -> bytes:
    """Lua's ``value or default``: only nil (and false) give way; an empty string does not."""
    return default if value is None else value


def _lua_lt(a: float | None, b: float | None) -> bool:
    """Lua's ``a < b`` on two ``tonumber`` results."""
    # A nil operand is a Lua runtime error; Python's TypeError comparing None is that error here.
    return a < b  # type: ignore[operator]


def _lua_gt(a: float | None, b: float | None) -> bool:
    """Lua's ``a > b`` on two ``tonumber`` results (a nil raises as in ``_lua_lt``)."""
    return a > b  # type: ignore[operator]


def _lua_count(value: bytes) -> int:
    """``tonumber(ARGV[i])`` used as a count or a key index (the Lua truncates it)."""
    # Not a number: Lua's nil where a number is needed, a runtime error; int(None)'s TypeError is that error here.
    return int(_tonumber(value))  # type: ignore[arg-type]


def _lua_concat(num: float | None) -> str:
    """A Lua number as ``..`` writes it (``%.14g``)."""
    if num is None:
        raise TypeError("attempt to concatenate a nil value")
    return f"{num:.14g}"


def _redis_arg(num: float | None) -> bytes:
    """A Lua number passed to redis.call, as Redis turns it into an argument (``%.17g``)."""
    if num is None:
        raise TypeError("Lua redis() command arguments must be strings or integers")
    return f"{num:.17g}".encode()


def _lua_int(num: float | None) -> int | None:
    """A Lua number returned to Redis: an integer reply, truncated."""
    return None if num is None else int(num)


def _lua_array(*items: Any) -> list[Any]:
    """A Lua table returned to Redis: an array, cut at its first nil."""
    out = []
    for item in items:
        if item is None:
            break
        out.append(item)
    return out


_LUA_ID = re.compile(rb"(\d+)-(\d+)")


def _newer(a: bytes, b: bytes) -> bool:
    """The scripts' ``newer``: a > b, comparing ``ms-seq`` as Lua numbers."""
    ma, mb = _LUA_ID.fullmatch(a), _LUA_ID.fullmatch(b)
    if ma is None or mb is None:
        raise TypeError("attempt to compare nil with number")
    am, as_, bm, bs = float(ma[1]), float(ma[2]), float(mb[1]), float(mb[2])
    return am > bm or (am == bm and as_ > bs)


def _cls(ch: str) -> str:
    return "\\" + ch if ch in "\\]^-[" else ch


@functools.lru_cache(maxsize=256)
def _glob(pattern: str) -> re.Pattern[str]:
    """Redis's glob (``stringmatchlen``) as a regular expression: ``*``, ``?``, ``[...]``
    with ``^`` and ranges, and ``\\`` escaping, also inside brackets."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[":
            i += 1
            negate = i < n and pattern[i] == "^"
            if negate:
                i += 1
            parts: list[str] = []
            while i < n:
                ch = pattern[i]
                if ch == "\\" and i + 1 < n:
                    i += 1
                    parts.append(_cls(pattern[i]))
                elif ch == "]":
                    break
                elif i + 2 < n and pattern[i + 1] == "-":
                    lo, hi = sorted((ch, pattern[i + 2]))
                    parts.append(_cls(lo) + "-" + _cls(hi))
                    i += 2
                else:
                    parts.append(_cls(ch))
                i += 1
            body = "".join(parts)
            if negate:
                out.append("[^" + body + "]" if body else ".")
            else:
                out.append("[" + body + "]" if body else "(?!)")
        elif c == "\\" and i + 1 < n:
            i += 1
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out), re.DOTALL)


def _matches(pattern: str, key: str) -> bool:
    if not key:
        return not pattern  # Redis's matcher never matches an empty string with a non-empty pattern
    return _glob(pattern).fullmatch(key) is not None


_SHA = {name: hashlib.sha1(text.encode()).hexdigest() for name, text in scripts.BY_NAME.items()}


# --- the server ----------------------------------------------------------------------------


class MemoryStore:
    """The server's state, shared by every :class:`MemoryBackend` connected to it.

    ``clock`` gives the time in ms (the simulation's clock; a wall clock in tests); run
    ids come from ``rng`` (or ``random.Random(seed)``), so a seed replays a run exactly.
    """

    def __init__(
        self,
        clock: Callable[[], int],
        *,
        seed: int = 0,
        rng: random.Random | None = None,
        silent_reconnect: bool = False,
        aof_window_ms: int = AOF_WINDOW_MS,
        compact_records: int = _COMPACT_RECORDS,
        shards: int = 1,
    ) -> None:
        if shards < 1:
            raise ValueError(f"a store has at least one shard, not {shards}")
        self.clock = clock
        self.silent_reconnect = silent_reconnect
        self.durable = False
        """Whether a crash keeps every write (``appendfsync always``); the simulation sets it."""
        """Connections carry on after a restart instead of failing their first call."""
        self.down = False
        """While True, every call of every connection raises RedisUnavailable."""
        self.generation = 0
        """How many times the server restarted (see crash)."""
        self.aof_window_ms = aof_window_ms
        self._rng = rng if rng is not None else random.Random(seed)
        self.run_id = self._new_run_id()
        self.shards = shards
        """How many masters the keys are spread over, by slot (store/shards.py); 1: one Redis."""
        self.run_ids = [self.run_id] + [self._new_run_id() for _ in range(shards - 1)]
        """Each shard's run id (shard 0's is ``run_id``)."""
        self.replids = [_replid(run, 0) for run in self.run_ids]
        """Each shard's replication id (a promoted replica starts a new one)."""
        self.failovers = [0] * shards
        """How many times each shard failed over."""
        self._shard_of_slot = [shard_of_slot(slot, shards) for slot in range(SLOTS)] if shards > 1 else []
        self._state = _State()
        self._base = _State()  # the state before the first record of the AOF
        self._aof: list[Record] = []
        self._aof_time = -(1 << 62)  # time of the newest record (records' times never go back)
        self._compacted_to: int | None = None  # time of the newest record folded into _base
        self._compact_records = compact_records
        self._compact_at = compact_records
        self._scripts: dict[str, Callable[[list[str], list[bytes], int], Any]] = {
            "commit": self._commit,
            "fence": self._fence,
            "dead_letter": self._dead_letter,
            "deliver": self._deliver,
            "advance_cursor": self._advance_cursor,
            "lease_acquire": self._lease_acquire,
            "lease_renew": self._lease_renew,
            "lease_release": self._lease_release,
            "project": self._project,
            "snapshot": self._snapshot,
            "set_aside": self._set_aside,
        }

    # --- faults -------------------------------------------------------------------------

    def crash(self, lose_after_ms: int | None = None) -> None:
        """Kill -9 and restart the server: keep the writes made at clock ``lose_after_ms``
        or before and lose the rest (None: lose nothing, like ``appendfsync always``). The
        server gets a new run id and every connection sees a reset (see MemoryBackend).

        The state is rebuilt from the recorded writes either way, so what Redis does not
        write to its AOF is forgotten as it is by Redis: a pending entry that its consumer
        read again (XREADGROUP with an id) goes back to its earlier delivery time and count.

        ``lose_after_ms`` may not reach back further than ``aof_window_ms`` before the
        newest write (older writes are folded into a snapshot): ValueError.
        """
        if lose_after_ms is not None:
            if self._compacted_to is not None and lose_after_ms < self._compacted_to:
                raise ValueError(
                    f"cannot lose the writes after {lose_after_ms}: those up to {self._compacted_to} are already in "
                    f"the snapshot (a crash loses at most the last {self.aof_window_ms} ms of writes)"
                )
            del self._aof[bisect.bisect_right(self._aof, lose_after_ms, key=_time_of) :]
        self._rebuild()
        if self.shards == 1:
            self.run_id = self._new_run_id()
            self.run_ids = [self.run_id]
        else:
            self.run_ids = [self._new_run_id() for _ in range(self.shards)]
            self.run_id = self.run_ids[0]
        self.replids = [_replid(run, 0) for run in self.run_ids]
        self.generation += 1

    def failover(self, shard: int, lose_after_ms: int | None = None) -> None:
        """Master ``shard`` dies and its replica is promoted: the writes made to that shard at
        clock ``lose_after_ms`` or before are on the replica, the rest are lost (replication
        is asynchronous; None: the replica had them all, as after ``WAIT``). The other shards
        keep everything. The shard's server gets the replica's run id and a new replication
        id; every connection sees one reset (a cluster client reconnects, and asks again
        which node holds what). The same limit as :meth:`crash` on how far back it loses."""
        if not 0 <= shard < self.shards:
            raise ValueError(f"no shard {shard}: the store has {self.shards}")
        if lose_after_ms is not None:
            if self._compacted_to is not None and lose_after_ms < self._compacted_to:
                raise ValueError(
                    f"cannot lose the writes after {lose_after_ms}: those up to {self._compacted_to} are already in "
                    f"the snapshot (a failover loses at most the last {self.aof_window_ms} ms of writes)"
                )
            k = bisect.bisect_right(self._aof, lose_after_ms, key=_time_of)
            self._aof[k:] = [r for r in self._aof[k:] if self.shard_of(r[2][0]) != shard]
        self._rebuild()
        self.failovers[shard] += 1
        self.run_ids[shard] = self._new_run_id()
        self.replids[shard] = _replid(self.run_ids[shard], self.failovers[shard])
        self.run_id = self.run_ids[0]
        self.generation += 1

    def shard_of(self, key: str) -> int:
        """The shard that holds ``key`` (by its slot: store/shards.py)."""
        return self._shard_of_slot[keyslot(key)] if self.shards > 1 else 0

    def identity(self, shard: int | None = None) -> str:
        """What a writer expects of the server (``server_id``): one Redis's run id, or the
        identities of every shard (store/shards.py); ``shard``: that shard's identity alone."""
        if shard is not None:
            return identity(self.run_ids[shard], self.replids[shard])
        if self.shards == 1:
            return self.run_id
        return ",".join(
            master_part(f"s{i}", [span], identity(run, rep))
            for i, (span, run, rep) in enumerate(zip(slot_ranges(self.shards), self.run_ids, self.replids))
        )

    def _rebuild(self) -> None:
        state = self._base.clone()
        for _, op, args in self._aof:
            op(state, *args)
        self._state = state

    # --- what the simulator and its invariants may look at (read-only) --------------------

    def streams(self) -> list[str]:
        """Names of every stream, sorted."""
        now = self.clock()
        return sorted(k for k, v in self._state.data.items() if isinstance(v, _Stream) and self._alive(k, now))

    def entries(self, stream: str) -> list[RawEntry]:
        """Every entry of ``stream`` (empty if there is no such stream)."""
        s = self._state.data.get(stream)
        if not isinstance(s, _Stream):
            return []
        return [(sid, dict(f)) for sid, f in zip(s.sids, s.fields)]

    def length(self, stream: str) -> int:
        """How many entries ``stream`` holds (0 if there is no such stream), without copying them."""
        s = self._state.data.get(stream)
        return len(s.sids) if isinstance(s, _Stream) else 0

    def groups(self, stream: str) -> dict[str, str]:
        """The consumer groups of ``stream``: name -> last delivered id."""
        s = self._state.data.get(stream)
        if not isinstance(s, _Stream):
            return {}
        return {name: _fmt(g.last) for name, g in s.groups.items()}

    def pending(self, stream: str, group: str) -> list[PendingEntry]:
        """The pending entries of ``group`` on ``stream``, in id order."""
        s = self._state.data.get(stream)
        g = s.groups.get(group) if isinstance(s, _Stream) else None
        if g is None:
            return []
        return [PendingEntry(_fmt(e), *g.pel[e]) for e in g.order]

    def dump(self) -> dict[str, Any]:
        """The whole state as plain values (for comparing two stores, or a store with itself
        after a restart): ``{"keys": {key: value}, "expires": {key: deadline}}``."""
        keys: dict[str, Any] = {}
        for key in sorted(self._state.data):
            v = self._state.data[key]
            if isinstance(v, _Stream):
                keys[key] = {
                    "entries": [(sid, dict(f)) for sid, f in zip(v.sids, v.fields)],
                    "last": _fmt(v.last),
                    "groups": {
                        name: {"last": _fmt(g.last), "pending": [(_fmt(e), *g.pel[e]) for e in g.order]}
                        for name, g in sorted(v.groups.items())
                    },
                }
            else:
                keys[key] = dict(v) if isinstance(v, dict) else v
        return {"keys": keys, "expires": dict(sorted(self._state.expires.items()))}

    # --- machinery ----------------------------------------------------------------------

    def _new_run_id(self) -> str:
        return f"{self._rng.getrandbits(160):040x}"

    def _tick(self) -> int:
        """The clock for one command (or script); mutations are recorded at this time."""
        now = self.clock()
        if now > self._aof_time:
            self._aof_time = now
        if len(self._aof) >= self._compact_at:
            self._compact()
        return now

    def _compact(self) -> None:
        """Fold the records older than the window into the snapshot."""
        cutoff = self._aof_time - self.aof_window_ms
        k = bisect.bisect_right(self._aof, cutoff, key=_time_of)
        if k:
            base = self._base
            for _, op, args in self._aof[:k]:
                op(base, *args)
            self._compacted_to = self._aof[k - 1][0]
            del self._aof[:k]
        self._compact_at = max(self._compact_records, 2 * len(self._aof))

    def _do(self, op: Op, *args: Any) -> None:
        """Apply one mutation and record it."""
        self._aof.append((self._aof_time, op, args))
        op(self._state, *args)

    def _alive(self, key: str, now: int) -> bool:
        if key not in self._state.data:
            return False
        deadline = self._state.expires.get(key)
        return deadline is None or deadline >= now

    def _read(self, key: str, now: int) -> Value | None:
        """The live value of ``key`` for a read (an expired key reads as missing)."""
        st = self._state
        v = st.data.get(key)
        if v is not None and st.expires and key in st.expires and st.expires[key] < now:
            return None
        return v

    def _write(self, key: str, now: int) -> Value | None:
        """The live value of ``key`` before a write (an expired key is deleted first)."""
        st = self._state
        v = st.data.get(key)
        if v is not None and st.expires and key in st.expires and st.expires[key] < now:
            self._do(_op_del, key)
            return None
        return v

    def _stream(self, key: str, now: int, write: bool = False) -> _Stream | None:
        v = self._write(key, now) if write else self._read(key, now)
        if v is None or isinstance(v, _Stream):
            return v
        raise WrongType(_WRONGTYPE)

    def _hash(self, key: str, now: int, write: bool = False) -> dict[bytes, bytes] | None:
        v = self._write(key, now) if write else self._read(key, now)
        if v is None or isinstance(v, dict):
            return v
        raise WrongType(_WRONGTYPE)

    def _group(self, key: str, group: str, now: int, what: str = "") -> tuple[_Stream, _Group]:
        s = self._stream(key, now)
        g = s.groups.get(group) if s is not None else None
        if s is None or g is None:
            raise NoGroup(f"NOGROUP No such key '{key}' or consumer group '{group}'{what}")
        return s, g

    # --- commands (what the backend and the scripts call) -------------------------------

    def _get(self, key: str, now: int) -> bytes | None:
        v = self._read(key, now)
        if v is None or isinstance(v, bytes):
            return v
        raise WrongType(_WRONGTYPE)

    def _set(self, key: str, value: bytes) -> None:
        self._do(_op_set, key, value)

    def _type(self, key: str, now: int) -> str:
        v = self._read(key, now)
        if v is None:
            return "none"
        return "string" if isinstance(v, bytes) else "hash" if isinstance(v, dict) else "stream"

    def _hget(self, key: str, field: bytes, now: int) -> bytes | None:
        h = self._hash(key, now)
        return None if h is None else h.get(field)

    def _hset(self, key: str, mapping: dict[bytes, bytes], now: int) -> int:
        h = self._hash(key, now, write=True)
        added = len(mapping) if h is None else sum(1 for f in mapping if f not in h)
        self._do(_op_hset, key, mapping)
        return added

    def _hdel(self, key: str, fields: Sequence[bytes], now: int) -> int:
        h = self._hash(key, now, write=True)
        if h is None:
            return 0
        gone = tuple(dict.fromkeys(f for f in fields if f in h))
        if gone:
            self._do(_op_hdel, key, gone)
        return len(gone)

    def _delete(self, key: str, now: int) -> int:
        if self._write(key, now) is None:
            return 0
        self._do(_op_del, key)
        return 1

    def _pttl(self, key: str, now: int) -> int:
        if self._read(key, now) is None:
            return -2
        deadline = self._state.expires.get(key)
        return -1 if deadline is None else deadline - now

    def _pexpire(self, key: str, ms: bytes, now: int) -> int:
        try:
            delta = int(ms)
        except ValueError:
            raise CommandError(_NOT_INT) from None
        if self._write(key, now) is None:
            return 0
        deadline = now + delta
        if deadline <= now:
            self._do(_op_del, key)
        else:
            self._do(_op_pexpireat, key, deadline)
        return 1

    def _incr(self, key: str, now: int) -> int:
        v = self._write(key, now)
        if v is None:
            n = 0
        elif isinstance(v, bytes):
            if not re.fullmatch(rb"-?[1-9][0-9]{0,18}|0", v):
                raise CommandError(_NOT_INT)
            n = int(v)
        else:
            raise WrongType(_WRONGTYPE)
        n += 1
        self._do(_op_setkeep, key, str(n).encode())
        return n

    def _xadd(self, key: str, fields: Fields, now: int, maxlen: int | None = None) -> str:
        s = self._stream(key, now, write=True)
        last = s.last if s is not None else (0, 0)
        new = (now, 0) if now > last[0] else (last[0], last[1] + 1)
        sid = f"{new[0]}-{new[1]}"
        self._do(_op_xadd, key, new, sid, fields)
        if maxlen is not None:
            extra = len(_stream_at(self._state, key).ids) - max(maxlen, 0)
            if extra > 0:
                self._do(_op_xtrim, key, extra)
        return sid

    def _xack(self, key: str, group: str, ids: Sequence[str], now: int) -> int:
        s = self._stream(key, now)
        g = s.groups.get(group) if s is not None else None
        if g is None:
            return 0
        parsed = [_parse_id(i) for i in ids]
        gone = tuple(dict.fromkeys(e for e in parsed if e in g.pel))
        if gone:
            self._do(_op_unpend, key, group, gone)
        return len(gone)

    def _is_pending(self, key: str, group: str, entry: str, now: int) -> bool:
        """``#XPENDING key group id id 1 == 1``: the id is an interval's two bounds (``-`` and
        ``+`` too; ``ms`` alone is every id of that millisecond), parsed before the group is
        looked for."""
        start, end = _parse_bound(entry), _parse_bound(entry, _MAX)
        _, g = self._group(key, group, now)
        i = bisect.bisect_left(g.order, start)
        return i < len(g.order) and g.order[i] <= end

    # --- the scripts, ported from store/scripts.py (read them side by side) -------------

    def _script(self, name: str, keys: Sequence[str], args: Sequence[Any], now: int) -> Any:
        run = self._scripts[name]
        argv = [a if type(a) is bytes else _b(a) for a in args]
        try:
            return run(list(keys), argv, now)
        except (CommandError, NoGroup) as exc:  # an error of a redis.call: the script stops there
            raise ScriptFailed(f"{exc} script: {_SHA[name]}") from None
        except (IndexError, TypeError, ValueError) as exc:  # a Lua runtime error (nil where a value was needed)
            raise ScriptFailed(f"user_script: {exc} script: {_SHA[name]}") from None

    def _restarted(self, expected: bytes, key: str) -> None:
        """The scripts' ``restarted``, on the shard of ``key`` (store/shards.py)."""
        if expected == b"":
            return
        if self.shards == 1 and expected == self.run_id.encode():
            return
        i = self.shard_of(key)
        run, rep = self.run_ids[i], self.replids[i]
        text = expected.decode()
        if not matches(text, run, rep):
            raise ScriptFailed(f"{scripts.RESTARTED} {identity(run, rep) if ':' in text else run}")

    def _commit(self, keys: list[str], argv: list[bytes], now: int) -> list[Any]:
        self._restarted(argv[1], keys[0])
        epoch = _tonumber(argv[0])
        fence = _tonumber(_or(self._get(keys[0], now), b"0"))
        if _lua_lt(epoch, fence):
            raise ScriptFailed(f"{scripts.STALE} {_lua_concat(fence)}")
        n = _lua_count(argv[3])
        ci = _tonumber(argv[4 + n]) if 4 + n < len(argv) else None  # the outbox cursor to move, if any
        upto = argv[5 + n] if 5 + n < len(argv) else b""
        if ci is None or (ci != 0 and (ci < 3 or ci > len(keys) or ci != int(ci) or _LUA_ID.fullmatch(upto) is None)):
            raise ScriptFailed(f"{scripts.BAD_COMMIT} the cursor to advance is not a key and an entry id")
        checked: set[str] = set()
        for i in range(6 + n, len(argv), 3):  # every check before the first write
            if ci > 0 and _tonumber(argv[i]) == ci:
                raise ScriptFailed(f"{scripts.BAD_COMMIT} the cursor to advance is a stream the commit appends to")
            index = _lua_count(argv[i])
            if not 1 <= index <= len(keys):
                raise TypeError("Lua redis() command arguments must be strings or integers")
            key = keys[index - 1]
            if key not in checked:
                checked.add(key)
                kind = self._type(key, now)
                if kind != "stream" and kind != "none":
                    raise ScriptFailed(f"{scripts.NOT_A_STREAM} {key} is a {kind}")
        group = argv[2]
        if group != b"" and n > 0:
            name = _s(group)
            if n == 1:
                if self._xack(keys[1], name, [_s(argv[4])], now) == 0:
                    return [b"DUP"]
            else:
                seen: set[bytes] = set()
                for i in range(4, 4 + n):
                    entry = argv[i]
                    if entry in seen:
                        raise ScriptFailed(f"{scripts.BAD_COMMIT} entry {_s(entry)} is consumed twice in one commit")
                    seen.add(entry)
                    if not self._is_pending(keys[1], name, _s(entry), now):
                        return [b"DUP"]
                self._xack(keys[1], name, [_s(a) for a in argv[4 : 4 + n]], now)
        if _lua_gt(epoch, fence):
            self._set(keys[0], _redis_arg(epoch))
        if ci > 0:
            cursor = keys[int(ci) - 1]
            kind = self._type(cursor, now)
            cur = self._get(cursor, now) if kind == "string" else None
            if kind == "none" or (cur is not None and (_LUA_ID.fullmatch(cur) is None or _newer(upto, cur))):
                self._set(cursor, upto)
        before: bytes | None = None
        for i in range(6 + n, len(argv), 3):
            if argv[i + 2] != b"":
                index = _lua_count(argv[i])
                if not 1 <= index <= len(keys):
                    raise TypeError("Lua redis() command arguments must be strings or integers")
                s = self._stream(keys[index - 1], now)
                before = s.sids[-1].encode() if s is not None and s.sids else b""
                break
        out: list[Any] = [b"OK"]
        for i in range(6 + n, len(argv), 3):
            index = _lua_count(argv[i])
            if not 1 <= index <= len(keys):
                raise TypeError("Lua redis() command arguments must be strings or integers")
            to = argv[i + 2]
            fields = {b"e": argv[i + 1]} if to == b"" else {b"e": argv[i + 1], b"to": to}
            out.append(self._xadd(keys[index - 1], fields, now).encode())
        if before is not None:
            out.append(before)
        return out

    def _dead_letter(self, keys: list[str], argv: list[bytes], now: int) -> Any:
        if argv[0] != b"" and not self._is_pending(keys[0], _s(argv[0]), _s(argv[1]), now):
            return 0
        fields = {b"stream": keys[0].encode(), b"entry": argv[1], b"kind": argv[2], b"reason": argv[3]}
        for i in range(4, len(argv), 2):
            fields[b"field:" + argv[i]] = argv[i + 1]
        parked = self._xadd(keys[1], fields, now).encode()
        if argv[0] != b"":
            self._xack(keys[0], _s(argv[0]), [_s(argv[1])], now)
        return parked

    def _set_aside(self, keys: list[str], argv: list[bytes], now: int) -> bytes:
        kind = self._type(keys[0], now)
        if kind == "stream":
            return b""
        if kind != "none":  # RENAME: the value and its time to live
            value = self._write(keys[0], now)
            deadline = self._state.expires.get(keys[0])
            self._delete(keys[1], now)
            if isinstance(value, bytes):
                self._do(_op_set, keys[1], value)
            else:
                self._do(_op_hset, keys[1], dict(cast("dict[bytes, bytes]", value)))  # kind is "hash"
            if deadline is not None:
                self._do(_op_pexpireat, keys[1], deadline)
            self._do(_op_del, keys[0])
        if argv[0] != b"":
            self._do(_op_mkstream, keys[0])
            self._do(_op_group, keys[0], _s(argv[0]), (0, 0))
        return b"" if kind == "none" else kind.encode()

    def _deliver(self, keys: list[str], argv: list[bytes], now: int) -> int:
        self._restarted(argv[0], keys[0])
        kind = self._type(keys[0], now)
        if kind != "stream" and kind != "none":
            raise ScriptFailed(f"{scripts.NOT_A_STREAM} {kind}")
        origin = argv[1]
        last = self._hget(keys[1], origin, now)
        n = 0
        for i in range(2, len(argv), 2):
            if last is None or _newer(argv[i], last):
                self._xadd(keys[0], {b"e": argv[i + 1], b"from": origin, b"ref": argv[i]}, now)
                last = argv[i]
                n += 1
        if n > 0 and last is not None:  # (n > 0: last is the newest id appended)
            self._hset(keys[1], {origin: last}, now)
        return n

    def _advance_cursor(self, keys: list[str], argv: list[bytes], now: int) -> bytes:
        self._restarted(argv[0], keys[0])
        cur = self._get(keys[0], now)
        if cur is None or _newer(argv[1], cur):
            self._set(keys[0], argv[1])
            return argv[1]
        return cur

    def _lease_acquire(self, keys: list[str], argv: list[bytes], now: int) -> list[Any]:
        holder = self._hget(keys[0], b"holder", now)
        if holder is not None:
            epoch = _tonumber(self._hget(keys[0], b"epoch", now))
            if holder == argv[0]:
                self._pexpire(keys[0], argv[1], now)
                return _lua_array(_lua_int(epoch), 0)
            return _lua_array(_lua_int(epoch), -max(self._pttl(keys[0], now), 1))
        taken = self._incr(keys[1], now)
        self._hset(keys[0], {b"holder": argv[0], b"epoch": _redis_arg(taken)}, now)
        self._pexpire(keys[0], argv[1], now)
        fence = _tonumber(_or(self._get(keys[2], now), b"0"))
        if _lua_gt(taken, fence):
            self._set(keys[2], _redis_arg(taken))
        return [taken, 1]

    def _lease_renew(self, keys: list[str], argv: list[bytes], now: int) -> int:
        self._restarted(argv[3], keys[0])
        if self._hget(keys[0], b"holder", now) == argv[0] and self._hget(keys[0], b"epoch", now) == argv[1]:
            self._pexpire(keys[0], argv[2], now)
            return 1
        return 0

    def _lease_release(self, keys: list[str], argv: list[bytes], now: int) -> int:
        if self._hget(keys[0], b"holder", now) == argv[0] and self._hget(keys[0], b"epoch", now) == argv[1]:
            self._delete(keys[0], now)
            return 1
        return 0

    def _fence(self, keys: list[str], argv: list[bytes], now: int) -> int | None:
        self._restarted(argv[1], keys[0])
        fence = _tonumber(_or(self._get(keys[0], now), b"0"))
        epoch = _tonumber(argv[0])
        if _lua_lt(epoch, fence):
            raise ScriptFailed(f"{scripts.STALE} {_lua_concat(fence)}")
        self._set(keys[0], _redis_arg(epoch))
        return _lua_int(epoch)

    def _project(self, keys: list[str], argv: list[bytes], now: int) -> int:
        self._restarted(argv[0], keys[0])
        argv = argv[1:]
        cur = _or(self._get(keys[0], now), b"")
        if cur != argv[0]:
            return 0
        n = _lua_count(argv[2])
        i = 3
        if n > 0:
            pairs = [argv[j] for j in range(i, i + 2 * n)]
            self._hset(keys[1], dict(zip(pairs[::2], pairs[1::2])), now)
            i += 2 * n
        if i < len(argv):
            self._hdel(keys[1], argv[i:], now)
        self._set(keys[0], argv[1])
        return 1

    def _snapshot(self, keys: list[str], argv: list[bytes], now: int) -> bytes:
        self._restarted(argv[1], keys[0])
        fence = _tonumber(_or(self._get(keys[0], now), b"0"))
        if _lua_lt(_tonumber(argv[0]), fence):
            raise ScriptFailed(f"{scripts.STALE} {_lua_concat(fence)}")
        s = self._stream(keys[1], now)
        pos = s.sids[-1].encode() if s is not None and s.sids else b"0-0"
        self._hset(keys[2], {b"pos": pos, b"data": argv[2]}, now)
        return pos


# --- a connection --------------------------------------------------------------------------


class MemoryBackend(Backend):
    """One process's connection to a :class:`MemoryStore` (``name`` for messages)."""

    def __init__(self, store: MemoryStore, name: str = "memory") -> None:
        self.store = store
        self.name = name
        self._generation = store.generation

    def _enter(self) -> int:
        """Check the connection; the clock for this call."""
        store = self.store
        if store.down:
            raise RedisUnavailable(f"{self.describe()} does not answer: the server is down")
        if self._generation != store.generation:
            self._generation = store.generation
            if not store.silent_reconnect:
                raise RedisUnavailable(f"{self.describe()}: connection reset by peer (the server restarted)")
        return store._tick()

    # --- the server ---
    def server_id(self) -> str:
        self._enter()
        return self.store.identity()

    def time_ms(self) -> int:
        return self._enter()

    def describe(self) -> str:
        return f"memory://{self.name}"

    def durable(self) -> bool:
        self._enter()
        return self.store.durable

    # --- strings and hashes ---
    def get(self, key: str) -> bytes | None:
        return self.store._get(key, self._enter())

    def set(self, key: str, value: bytes, *, nx: bool = False) -> bool:
        now = self._enter()
        if nx and self.store._read(key, now) is not None:
            return False
        self.store._set(key, _b(value))
        return True

    def exists(self, *keys: str) -> int:
        now = self._enter()
        return sum(1 for k in keys if self.store._read(k, now) is not None)

    def delete(self, *keys: str) -> int:
        if not keys:
            return 0
        now = self._enter()
        return sum(self.store._delete(k, now) for k in keys)

    def hget(self, key: str, field: str) -> bytes | None:
        return self.store._hget(key, _b(field), self._enter())

    def hgetall(self, key: str) -> dict[bytes, bytes]:
        h = self.store._hash(key, self._enter())
        return {} if h is None else dict(h)

    def hkeys(self, key: str) -> list[bytes]:
        h = self.store._hash(key, self._enter())
        return [] if h is None else list(h)

    def hset(self, key: str, mapping: Mapping[str, bytes]) -> int:
        if not mapping:
            return 0
        now = self._enter()
        return self.store._hset(key, {_b(k): _b(v) for k, v in mapping.items()}, now)

    def hdel(self, key: str, *fields: str) -> int:
        if not fields:
            return 0
        now = self._enter()
        return self.store._hdel(key, [_b(f) for f in fields], now)

    def get_and_hgetall(self, key: str, hash_key: str) -> tuple[bytes | None, dict[bytes, bytes]]:
        now = self._enter()
        value = self.store._get(key, now)
        h = self.store._hash(hash_key, now)
        return value, {} if h is None else dict(h)

    def hgetall_with_ttl(self, key: str) -> tuple[dict[bytes, bytes], int]:
        now = self._enter()
        h = self.store._hash(key, now)
        return ({} if h is None else dict(h)), self.store._pttl(key, now)

    # --- streams ---
    def xadd(self, stream: str, fields: Mapping[bytes, bytes], *, maxlen: int | None = None) -> str:
        if not fields:
            raise CommandError("wrong number of arguments for 'xadd' command")
        if maxlen is not None and maxlen < 0:
            raise CommandError(_BAD_MAXLEN)
        now = self._enter()
        return self.store._xadd(stream, {_b(k): _b(v) for k, v in fields.items()}, now, maxlen)

    def xadd_many(self, items: Sequence[tuple[str, Mapping[bytes, bytes]]]) -> list[str]:
        """A transaction (MULTI/EXEC): an entry Redis refuses before running anything (no
        fields) appends none; else every command runs, then the first error that is not
        WRONGTYPE is raised, or PartlyAppended if a key was not a stream."""
        if not items:
            return []
        if any(not fields for _, fields in items):
            raise CommandError("wrong number of arguments for 'xadd' command")
        now = self._enter()
        out: list[str | None] = []
        errors: dict[int, str] = {}
        other: CommandError | None = None
        for i, (stream, fields) in enumerate(items):
            try:
                if not fields:
                    raise CommandError("wrong number of arguments for 'xadd' command")
                out.append(self.store._xadd(stream, {_b(k): _b(v) for k, v in fields.items()}, now))
            except CommandError as exc:
                out.append(None)
                if isinstance(exc, WrongType):
                    errors[i] = str(exc)
                else:
                    other = other or exc
        if other is not None:
            raise other
        if errors:
            raise PartlyAppended(out, errors)
        return cast(list[str], out)

    def xrange(self, stream: str, after: str | None, count: int) -> list[RawEntry]:
        now = self._enter()
        start = (0, 0) if after in (None, "0", "0-0", "-") else _parse_start("(" + after)
        s = self.store._stream(stream, now)
        if s is None or count <= 0:
            return []
        i = bisect.bisect_left(s.ids, start)
        j = min(i + count, len(s.ids))
        sids, fields = s.sids, s.fields
        return [(sids[k], dict(fields[k])) for k in range(i, j)]

    def last_id(self, stream: str) -> str | None:
        s = self.store._stream(stream, self._enter())
        return s.sids[-1] if s is not None and s.sids else None

    def xlen(self, stream: str) -> int:
        s = self.store._stream(stream, self._enter())
        return 0 if s is None else len(s.ids)

    def xread(self, positions: Mapping[str, str], *, count: int, block_ms: int | None) -> list[tuple[str, str, Fields]]:
        if not positions:
            return []
        now = self._enter()
        plan: list[tuple[str, _Stream, Id]] = []
        for stream, position in positions.items():
            s = self.store._stream(stream, now)
            if position == ">":
                raise CommandError(_GT_OUTSIDE_GROUP)
            after = (s.last if s is not None else (0, 0)) if position == "$" else _parse_id(position)
            if s is not None:
                plan.append((stream, s, after))
        out: list[tuple[str, str, Fields]] = []
        for stream, s, after in plan:
            i = bisect.bisect_right(s.ids, after)
            for k in range(i, min(i + count, len(s.ids)) if count > 0 else len(s.ids)):  # COUNT 0: no limit
                out.append((stream, s.sids[k], dict(s.fields[k])))
        return out

    def xtrim_minid(self, stream: str, minid: str) -> int:
        now = self._enter()
        cut = _parse_id(minid)  # (an invalid id is refused before the key's type is looked at)
        s = self.store._stream(stream, now, write=True)
        if s is None:
            return 0
        n = bisect.bisect_left(s.ids, cut)
        if n:
            self.store._do(_op_xtrim, stream, n)
        return n

    def scan_streams(self, pattern: str) -> list[str]:
        now = self._enter()
        st = self.store
        return sorted(
            k
            for k, v in st._state.data.items()
            if isinstance(v, _Stream) and _matches(pattern, k) and st._alive(k, now)
        )

    def scan_keys(self, pattern: str) -> list[str]:
        now = self._enter()
        st = self.store
        return sorted(k for k in st._state.data if _matches(pattern, k) and st._alive(k, now))

    # --- consumer groups ---
    def group_create(self, stream: str, group: str, start: str) -> None:
        now = self._enter()
        s = self.store._stream(stream, now, write=True)
        last = (s.last if s is not None else (0, 0)) if start == "$" else _parse_id(start)
        if s is None:
            self.store._do(_op_mkstream, stream)
        elif group in s.groups:
            return  # BUSYGROUP: it exists
        self.store._do(_op_group, stream, group, last)

    def group_setid(self, stream: str, group: str, start: str) -> None:
        now = self._enter()
        s = self.store._stream(stream, now, write=True)
        if s is None:
            raise NoGroup(
                "The XGROUP subcommand requires the key to exist. Note that for CREATE you may want "
                "to use the MKSTREAM option to create an empty stream automatically."
            )
        if group not in s.groups:
            raise NoGroup(f"NOGROUP No such consumer group '{group}' for key name '{stream}'")
        # (SETID takes '-' and '+' too, which CREATE refuses)
        self.store._do(_op_setid, stream, group, s.last if start == "$" else _parse_bound(start))

    def group_state(self, stream: str, group: str) -> GroupState | None:
        now = self._enter()
        v = self.store._read(stream, now)
        g = v.groups.get(group) if isinstance(v, _Stream) else None
        if g is None:
            return None
        return GroupState(_fmt(g.last), len(g.order), _fmt(g.order[0]) if g.order else None)

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
        for stream, ids in (ack or {}).items():
            if ids:
                try:
                    self.xack(stream, group, ids)
                except (CommandError, NoGroup):  # nothing there to acknowledge any more
                    pass
        if not streams:
            return []
        now = self._enter()
        store = self.store
        plan: list[tuple[str, _Stream, _Group, Id | None]] = []
        for stream, position in streams.items():  # every stream is checked before any is read
            s, g = store._group(stream, group, now, " in XREADGROUP with GROUP option")
            if position == "$":
                raise CommandError(_DOLLAR_IN_GROUP)
            plan.append((stream, s, g, None if position == ">" else _parse_id(position)))
        out: list[tuple[str, str, Fields | None]] = []
        for stream, s, g, after in plan:
            if after is None:  # new entries
                i = bisect.bisect_right(s.ids, g.last)
                j = min(i + count, len(s.ids)) if count > 0 else len(s.ids)
                if i < j:
                    for k in range(i, j):
                        out.append((stream, s.sids[k], dict(s.fields[k])))
                    store._do(_op_deliver, stream, group, consumer, tuple(s.ids[i:j]), now)
                continue
            order, pel = g.order, g.pel  # this consumer's pending entries after ``after``
            touched: list[Id] = []
            n = 0
            for k in range(bisect.bisect_right(order, after), len(order)):
                if 0 < count <= n:
                    break
                entry = order[k]
                if pel[entry][0] != consumer:
                    continue
                n += 1
                at = s.find(entry)
                if at < 0:
                    out.append((stream, _fmt(entry), None))
                else:
                    out.append((stream, s.sids[at], dict(s.fields[at])))
                    touched.append(entry)
            if touched:
                _op_touch(store._state, stream, group, tuple(touched), now)  # not durable, as in Redis
        return out

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
        out = self.xreadgroup(group, consumer, streams, count=count, block_ms=block_ms, ack=ack)
        others: dict[str, int] = {}
        for stream in streams:  # XPENDING's summary, after the read
            v = self.store._read(stream, self._enter())
            g = v.groups.get(group) if isinstance(v, _Stream) else None
            n = sum(1 for owner, _, _ in g.pel.values() if owner != consumer) if g is not None else 0
            if n:
                others[stream] = n
        return out, others

    def xautoclaim(
        self, stream: str, group: str, consumer: str, *, min_idle_ms: int, start: str, count: int
    ) -> tuple[str, list[tuple[str, Fields | None]]]:
        now = self._enter()
        store = self.store
        first = _parse_start(start)  # (the arguments are refused before the key and the group are looked at)
        if count <= 0:
            raise CommandError("COUNT must be > 0")
        s, g = store._group(stream, group, now)
        attempts = count * 10
        order, pel = g.order, g.pel
        i = bisect.bisect_left(order, first)
        candidates = order[i : i + attempts + 1]
        claimed: list[tuple[str, Fields | None]] = []
        claims: list[tuple[Id, str, int, int]] = []
        deleted: list[Id] = []
        last = -1  # index in candidates of the last entry looked at
        while attempts and count and last + 1 < len(candidates):
            attempts -= 1
            last += 1
            entry = candidates[last]
            at = s.find(entry)
            if at < 0:  # deleted while pending: dropped from the group (Redis 7)
                deleted.append(entry)
                count -= 1
                continue
            if min_idle_ms > 0 and now - pel[entry][1] < min_idle_ms:
                continue
            claimed.append((s.sids[at], dict(s.fields[at])))
            claims.append((entry, consumer, now, pel[entry][2] + 1))
            count -= 1
        cursor = _fmt(candidates[last + 1]) if last + 1 < len(candidates) else "0-0"
        if deleted:
            store._do(_op_unpend, stream, group, tuple(deleted))
        if claims:
            store._do(_op_claim, stream, group, tuple(claims))
        return cursor, claimed

    def xack(self, stream: str, group: str, ids: Sequence[str]) -> int:
        if not ids:
            return 0
        return self.store._xack(stream, group, ids, self._enter())

    # --- scripts ---
    def script(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        return self.store._script(name, keys, args, self._enter())

    def script_many(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """A pipeline: every script runs, in order; an error reply takes its call's place."""
        if not calls:
            return []
        now = self._enter()
        out: list[Any] = []
        for name, keys, args in calls:
            try:
                out.append(self.store._script(name, keys, args, now))
            except ScriptFailed as exc:
                out.append(exc)
        return out
