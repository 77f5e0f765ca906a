"""The in-memory twin (store/memory.py) against a real redis-server, call by call.

Every Backend method, with every error Redis answers in Sluice's use: WRONGTYPE on a key of
another kind, NOGROUP on a missing group or stream, BUSYGROUP, a missing key, an invalid
stream id, MAXLEN and COUNT at their edges, and each script's own error codes. Both must
give the same answer, or raise the same exception class with the same text, and hold the
same data afterwards (a simulation run on the twin counts for Redis only so far as this
holds).

* ``Twins`` runs one call on both and compares (entry ids are translated: each server has
  its own clock).
* ``ERROR_PATHS``: one case per error path of each command, with the class both raise.
* A hypothesis state machine: random sequences of calls over a small key space whose keys
  change kind, compared after every call (``differential_call`` is one call).
"""

from __future__ import annotations

import random
import re
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from sluice.store.backend import GroupState
from sluice.store.memory import MemoryBackend, MemoryStore

TEN_MINUTES = 600_000


class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class Twins:
    """Runs every call on a real Redis and on a memory store and compares the answers.

    Entry ids differ (each server has its own clock), so after every call the entries of
    each stream on the two servers are paired by position, and ids are translated through
    that pairing (per stream: two streams can hold the same id). Nothing here depends on
    time: idle times and TTLs are 0 or ten minutes."""

    def __init__(self, redis_url: str, prefix: str) -> None:
        from sluice.store import RedisBackend, connect

        self.redis = RedisBackend(connect(redis_url))
        self.clock = Clock(10**9)
        self.store = MemoryStore(self.clock)
        self.memory = MemoryBackend(self.store)
        tag = "{" + prefix + ":cluster}"
        self.streams = [tag + ":inbox", tag + ":facts", tag + ":dead", "{" + prefix + ":tm:x}:inbox"]
        self.others = [
            tag + ":s",
            tag + ":h",
            tag + ":leader",
            tag + ":epoch",
            tag + ":fence",
            tag + ":pos",
            "{" + prefix + ":tm:x}:delivered",
            tag + ":cursor",
            tag + ":snapshot",
            tag + ":aside",
        ]
        self.m2r: dict[str, dict[str, str]] = {s: {} for s in self.streams}
        self.r2m: dict[str, dict[str, str]] = {s: {} for s in self.streams}
        self.groups = ["g", "h"]

    def close(self) -> None:
        self.redis.delete(*self.streams, *self.others)
        self.redis.close()

    def ids(self, stream: str) -> list[str]:
        return [i for i, _ in self.store.entries(stream)]

    def call(self, name: str, *args: Any, home: str, reply_home: str | None = None, **kwargs: Any) -> tuple:
        """Call ``name`` on both; bare ids in arguments are ``home``'s, in the reply
        ``reply_home``'s (default: ``home``'s). Returns the memory store's outcome:
        ("ok", reply) or ("error", exception class name, text)."""
        r = _outcome(
            lambda: getattr(self.redis, name)(*self.map(args, self.m2r, home), **self.map(kwargs, self.m2r, home))
        )
        self.clock.now += 1
        m = _outcome(lambda: getattr(self.memory, name)(*args, **kwargs))
        self.sync()
        if r[0] == "error":  # an error names the entry of the arguments
            r = (*r[:2], re.sub(r"\d+-\d+", lambda g: self.r2m.get(home, {}).get(g[0], g[0]), r[2]))
        if name == "xadd_many" and r[0] == "ok":  # each id is its own stream's
            r = ("ok", [self.map(i, self.r2m, stream) for i, (stream, _) in zip(r[1], args[0])])
        theirs, ours = _normal(self.map(r, self.r2m, reply_home or home)), _normal(m)
        if (
            theirs[0] == ours[0] == "ok"
            and isinstance(ours[1], str)
            and re.fullmatch(r"\d+-\d+", ours[1])
            and ours[1] not in self.m2r.get(home, {})
            and theirs[1] not in self.r2m.get(home, {})
        ):
            theirs = ours = ("ok", "an id no longer in the stream")  # (XADD's own entry trimmed: MAXLEN 0)
        assert theirs == ours, f"{name} {args} {kwargs}: Redis {theirs}, memory {ours}"
        return m

    def map(self, value: Any, maps: dict[str, dict[str, str]], home: str) -> Any:
        """``value`` with the ids of ``home`` translated (those of another stream too, when
        they are not ``home``'s: a snapshot's position, a reply about another stream)."""
        if isinstance(value, str):
            return _translate(value, maps, home)
        if isinstance(value, bytes):
            got = _translate(value.decode(errors="replace"), maps, home, None)
            return got.encode() if got is not None else value
        if isinstance(value, tuple) and len(value) == 3 and value[0] in maps:  # (stream, id, fields)
            return (value[0], self.map(value[1], maps, value[0]), self.map(value[2], maps, value[0]))
        if isinstance(value, (list, tuple)):
            return type(value)(self.map(v, maps, home) for v in value)
        if isinstance(value, dict):
            if b"stream" in value and b"entry" in value:  # a dead letter names the entry's stream
                origin = value[b"stream"].decode()
                return {k: self.map(v, maps, origin) if k == b"entry" else v for k, v in value.items()}
            return {k: self.map(v, maps, home) for k, v in value.items()}
        if isinstance(value, GroupState):
            return GroupState(*self.map((value.last_delivered, value.pending, value.min_pending), maps, home))
        return value

    def sync(self) -> None:
        """Pair the entries of each stream, and check the two servers hold the same: every
        key's kind, a stream's entries, groups and pending entries, a string's or a hash's
        value, and whether a key has a time to live."""
        client = self.redis.client
        dump = self.store.dump()
        keys = [*self.streams, *self.others]
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.type(key)
            pipe.pttl(key)
        replies = pipe.execute()
        for key, kind, ttl in zip(keys, map(_s, replies[::2]), replies[1::2]):
            ours = dump["keys"].get(key)
            assert kind == _kind(ours), (key, kind, ours)
            assert (ttl > 0) == (key in dump["expires"]), key
            if kind == "string":
                assert client.get(key) == ours, key
            elif kind == "hash":  # (a snapshot's position is an entry id of the stream it covers)
                assert self.map(client.hgetall(key), self.r2m, key) == ours, key
            elif kind == "stream":
                self._sync_stream(key, ours["last"])

    def _sync_stream(self, stream: str, last_id: str) -> None:
        client = self.redis.client
        m2r, r2m = self.m2r.setdefault(stream, {}), self.r2m.setdefault(stream, {})
        theirs = [(i.decode(), f) for i, f in client.xrange(stream)]
        ours = self.store.entries(stream)
        last = (_s(client.xinfo_stream(stream)["last-generated-id"]), last_id)
        for (r, _), (m, _) in [
            *zip(theirs, ours),
            ((last[0], None), (last[1], None)),
        ]:  # (its last id: maybe trimmed since)
            m2r[m], r2m[r] = r, m
        assert [self.map(f, self.r2m, stream) for _, f in theirs] == [f for _, f in ours], stream
        groups = {_s(g["name"]): g for g in client.xinfo_groups(stream)}
        assert {
            n: self.map(_s(g["last-delivered-id"]), self.r2m, stream) for n, g in groups.items()
        } == self.store.groups(stream), stream
        for group in groups:
            pending = client.xpending_range(stream, group, "-", "+", 1000)
            assert [(r2m[_s(p["message_id"])], _s(p["consumer"]), p["times_delivered"]) for p in pending] == [
                (p.id, p.consumer, p.deliveries) for p in self.store.pending(stream, group)
            ], (stream, group)


def _translate(entry: str, maps: dict[str, dict[str, str]], home: str, default: Any = ...) -> Any:
    got = maps.get(home, {}).get(entry)
    if got is None:
        got = next((ids[entry] for ids in maps.values() if entry in ids), None)
    return got if got is not None else entry if default is ... else default


def _kind(value: Any) -> str:
    if value is None:
        return "none"
    return "string" if isinstance(value, bytes) else "hash" if "entries" not in value else "stream"


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else v


def _outcome(call: Any) -> tuple:
    try:
        reply = call()
    except Exception as exc:  # noqa: BLE001 - an error is an answer to compare
        return _error(exc)
    if isinstance(reply, list):  # script_many: an error in its call's place
        reply = [_error(r) if isinstance(r, Exception) else r for r in reply]
    return ("ok", reply)


def _error(exc: Exception) -> tuple:
    text = re.sub(r"\b[0-9a-f]{40}\b", "<run id>", str(exc).split(" script: ")[0])  # each server has its own
    if text.startswith("user_script:"):  # a Lua runtime error: the same failure, in Lua's words or Python's
        text = "user_script: (Lua runtime error)"
    return ("error", type(exc).__name__, text)


def _normal(outcome: tuple) -> tuple:
    """What may differ between two servers that agree: the order of hash keys and of a scan,
    and the time left on another holder's lease."""
    kind, value = outcome[0], outcome[-1]
    if kind == "ok" and isinstance(value, list) and len(value) == 2 and value[1] in range(-TEN_MINUTES, -1):
        return kind, [value[0], "-ttl"]
    if kind == "ok" and isinstance(value, tuple) and len(value) == 2 and value[1] in range(1, TEN_MINUTES + 1):
        return kind, (value[0], "ttl")  # hgetall_with_ttl
    if (
        kind == "ok"
        and isinstance(value, list)
        and value
        and all(isinstance(v, (str, bytes)) for v in value)
        and value[0] not in (b"OK", b"DUP")
    ):
        return kind, sorted(value)
    return outcome


def _prefix() -> str:
    return f"tw{uuid.uuid4().hex[:10]}"


# --- every error path, one by one ------------------------------------------------------------

# Keys by role: S a stream with entries S#0, S#1 and group g (S#0 pending for consumer a),
# N a stream without groups (entry N#0), E a missing key, STR a string, H a hash, F a
# tag's fence, CUR an outbox cursor, P a read model's position, SNAP a snapshot, ASIDE
# where SET_ASIDE moves a key, DEAD the dead letters, DEL a target's delivered marks.
# A case: (the outcome both give: "ok" or the exception class, method, args, kwargs).
_BIG = "18446744073709551616-0"  # past 2^64 - 1
ERROR_PATHS: dict[str, tuple[str, str, tuple, dict]] = {
    # consumer groups
    "group_create: an invalid id": ("CommandError", "group_create", ("S", "g2", "x"), {}),
    "group_create: an invalid id makes no stream": ("CommandError", "group_create", ("E", "g", "x"), {}),
    "group_create: a key of another kind": ("WrongType", "group_create", ("STR", "g", "0"), {}),
    "group_create: BUSYGROUP is nothing": ("ok", "group_create", ("S", "g", "$"), {}),
    "group_create: a missing stream is made": ("ok", "group_create", ("E", "g", "$"), {}),
    "group_setid: a missing stream": ("NoGroup", "group_setid", ("E", "g", "$"), {}),
    "group_setid: a missing group": ("NoGroup", "group_setid", ("N", "g", "$"), {}),
    "group_setid: a missing group and an invalid id": ("NoGroup", "group_setid", ("N", "g", "x"), {}),
    "group_setid: a key of another kind": ("WrongType", "group_setid", ("STR", "g", "$"), {}),
    "group_setid: an invalid id": ("CommandError", "group_setid", ("S", "g", "x"), {}),
    "group_setid: an id too big": ("CommandError", "group_setid", ("S", "g", _BIG), {}),
    "group_setid: + is the greatest id": ("ok", "group_setid", ("S", "g", "+"), {}),
    "group_setid: - is the least id": ("ok", "group_setid", ("S", "g", "-"), {}),
    "group_create: + is refused": ("CommandError", "group_create", ("S", "g2", "+"), {}),
    "group_setid: past the last entry": ("ok", "group_setid", ("S", "g", "99999999999999-0"), {}),
    "group_state: a missing stream": ("ok", "group_state", ("E", "g"), {}),
    "group_state: a missing group": ("ok", "group_state", ("N", "g"), {}),
    "group_state: a key of another kind": ("ok", "group_state", ("STR", "g"), {}),
    "xreadgroup: a missing stream": ("NoGroup", "xreadgroup", ("g", "a", {"E": ">"}), {"count": 5, "block_ms": None}),
    "xreadgroup: a missing group": ("NoGroup", "xreadgroup", ("g", "a", {"N": ">"}), {"count": 5, "block_ms": None}),
    "xreadgroup: a key of another kind": (
        "WrongType",
        "xreadgroup",
        ("g", "a", {"STR": ">"}),
        {"count": 5, "block_ms": None},
    ),
    "xreadgroup: one stream of two of another kind": (
        "WrongType",
        "xreadgroup",
        ("g", "a", {"S": ">", "STR": ">"}),
        {"count": 5, "block_ms": None},
    ),
    "xreadgroup: one stream of two without the group": (
        "NoGroup",
        "xreadgroup",
        ("g", "a", {"S": ">", "N": ">"}),
        {"count": 5, "block_ms": None},
    ),
    "xreadgroup: the first stream's error first": (
        "NoGroup",
        "xreadgroup",
        ("g", "a", {"N": ">", "STR": ">"}),
        {"count": 5, "block_ms": None},
    ),
    "xreadgroup: an invalid id": ("CommandError", "xreadgroup", ("g", "a", {"S": "x"}), {"count": 5, "block_ms": None}),
    "xreadgroup: $": ("CommandError", "xreadgroup", ("g", "a", {"S": "$"}), {"count": 5, "block_ms": None}),
    "xreadgroup: COUNT 0 is no limit": ("ok", "xreadgroup", ("g", "b", {"S": ">"}), {"count": 0, "block_ms": None}),
    "xreadgroup_sole: a missing group": (
        "NoGroup",
        "xreadgroup_sole",
        ("g", "b", {"S": ">", "N": ">"}),
        {"count": 5, "block_ms": None},
    ),
    "xreadgroup_sole: a key of another kind": (
        "WrongType",
        "xreadgroup_sole",
        ("g", "b", {"STR": ">"}),
        {"count": 5, "block_ms": None},
    ),
    "xreadgroup_sole: another consumer's pending counted": (
        "ok",
        "xreadgroup_sole",
        ("g", "b", {"S": ">"}),
        {"count": 5, "block_ms": None},
    ),
    "xreadgroup: acknowledgements refused are dropped": (
        "ok",
        "xreadgroup",
        ("g", "a", {"S": "0"}),
        {"count": 5, "block_ms": None, "ack": {"N": ["N#0"], "E": ["1-0"]}},
    ),
    "xautoclaim: a missing stream": (
        "NoGroup",
        "xautoclaim",
        ("E", "g", "b"),
        {"min_idle_ms": 0, "start": "0-0", "count": 5},
    ),
    "xautoclaim: a missing group": (
        "NoGroup",
        "xautoclaim",
        ("N", "g", "b"),
        {"min_idle_ms": 0, "start": "0-0", "count": 5},
    ),
    "xautoclaim: a key of another kind": (
        "WrongType",
        "xautoclaim",
        ("STR", "g", "b"),
        {"min_idle_ms": 0, "start": "0-0", "count": 5},
    ),
    "xautoclaim: an invalid start before the group": (
        "CommandError",
        "xautoclaim",
        ("N", "g", "b"),
        {"min_idle_ms": 0, "start": "x", "count": 5},
    ),
    "xautoclaim: an invalid start before the kind": (
        "CommandError",
        "xautoclaim",
        ("STR", "g", "b"),
        {"min_idle_ms": 0, "start": "x", "count": 5},
    ),
    "xautoclaim: COUNT 0": (
        "CommandError",
        "xautoclaim",
        ("S", "g", "b"),
        {"min_idle_ms": 0, "start": "0-0", "count": 0},
    ),
    "xautoclaim: COUNT -1 before the group": (
        "CommandError",
        "xautoclaim",
        ("N", "g", "b"),
        {"min_idle_ms": 0, "start": "0-0", "count": -1},
    ),
    "xautoclaim: a negative idle time is 0": (
        "ok",
        "xautoclaim",
        ("S", "g", "b"),
        {"min_idle_ms": -5, "start": "0-0", "count": 5},
    ),
    "xack: a missing stream": ("ok", "xack", ("E", "g", ["1-0"]), {}),
    "xack: a missing group": ("ok", "xack", ("N", "g", ["N#0"]), {}),
    "xack: a missing group and an invalid id": ("ok", "xack", ("N", "g", ["x"]), {}),
    "xack: a key of another kind": ("WrongType", "xack", ("STR", "g", ["1-0"]), {}),
    "xack: an invalid id": ("CommandError", "xack", ("S", "g", ["S#0", "x"]), {}),
    "xack: an id in milliseconds only": ("ok", "xack", ("S", "g", ["5"]), {}),
    # streams
    "xadd: a key of another kind": ("WrongType", "xadd", ("STR", {b"n": b"1"}), {}),
    "xadd: no fields": ("CommandError", "xadd", ("S", {}), {}),
    "xadd: MAXLEN -1": ("CommandError", "xadd", ("S", {b"n": b"1"}), {"maxlen": -1}),
    "xadd: MAXLEN -1 before the kind": ("CommandError", "xadd", ("STR", {b"n": b"1"}), {"maxlen": -1}),
    "xadd: MAXLEN 0 keeps nothing": ("ok", "xadd", ("S", {b"n": b"1"}), {"maxlen": 0}),
    "xadd: MAXLEN above the length keeps all": ("ok", "xadd", ("S", {b"n": b"1"}), {"maxlen": 1000}),
    "xadd_many: one key of another kind": (
        "PartlyAppended",
        "xadd_many",
        ([("S", {b"n": b"1"}), ("STR", {b"n": b"2"})],),
        {},
    ),
    "xadd_many: no fields appends nothing": ("CommandError", "xadd_many", ([("S", {b"n": b"1"}), ("N", {})],), {}),
    "xrange: a key of another kind": ("WrongType", "xrange", ("STR", None, 5), {}),
    "xrange: an invalid id": ("CommandError", "xrange", ("S", "x", 5), {}),
    "xrange: an invalid id before the kind": ("CommandError", "xrange", ("STR", "x", 5), {}),
    "xrange: the largest id": ("CommandError", "xrange", ("S", "18446744073709551615-18446744073709551615", 5), {}),
    "xrange: COUNT 0": ("ok", "xrange", ("S", None, 0), {}),
    "xrange: COUNT -1": ("ok", "xrange", ("S", None, -1), {}),
    "xrange: a missing stream": ("ok", "xrange", ("E", "S#0", 5), {}),
    "xread: a key of another kind": ("WrongType", "xread", ({"STR": "0"},), {"count": 5, "block_ms": None}),
    "xread: an invalid id": ("CommandError", "xread", ({"S": "x"},), {"count": 5, "block_ms": None}),
    "xread: an invalid id of a missing stream": (
        "CommandError",
        "xread",
        ({"E": "x"},),
        {"count": 5, "block_ms": None},
    ),
    "xread: > outside a group": ("CommandError", "xread", ({"S": ">"},), {"count": 5, "block_ms": None}),
    "xread: COUNT 0 is no limit": ("ok", "xread", ({"S": "0"},), {"count": 0, "block_ms": None}),
    "xread: $ of a missing stream": ("ok", "xread", ({"E": "$", "S": "$"},), {"count": 5, "block_ms": None}),
    "xtrim_minid: a key of another kind": ("WrongType", "xtrim_minid", ("STR", "1-0"), {}),
    "xtrim_minid: an invalid id": ("CommandError", "xtrim_minid", ("S", "x"), {}),
    "xtrim_minid: an invalid id before the kind": ("CommandError", "xtrim_minid", ("STR", "x"), {}),
    "xtrim_minid: a missing stream": ("ok", "xtrim_minid", ("E", "1-0"), {}),
    "xtrim_minid: past the last entry": ("ok", "xtrim_minid", ("S", "99999999999999-0"), {}),
    "last_id: a key of another kind": ("WrongType", "last_id", ("H",), {}),
    "last_id: a missing stream": ("ok", "last_id", ("E",), {}),
    "xlen: a key of another kind": ("WrongType", "xlen", ("STR",), {}),
    "scan_streams: none of another kind": ("ok", "scan_streams", ("PREFIX*",), {}),
    # strings and hashes
    "get: a hash": ("WrongType", "get", ("H",), {}),
    "get: a stream": ("WrongType", "get", ("S",), {}),
    "set: over a stream": ("ok", "set", ("S", b"v"), {}),
    "set: NX on a hash": ("ok", "set", ("H", b"v"), {"nx": True}),
    "hget: a string": ("WrongType", "hget", ("STR", "x"), {}),
    "hgetall: a stream": ("WrongType", "hgetall", ("S",), {}),
    "hkeys: a string": ("WrongType", "hkeys", ("STR",), {}),
    "hset: a stream": ("WrongType", "hset", ("S", {"x": b"1"}), {}),
    "get_and_hgetall: the first of another kind": ("WrongType", "get_and_hgetall", ("H", "H"), {}),
    "get_and_hgetall: the second of another kind": ("WrongType", "get_and_hgetall", ("STR", "STR"), {}),
    "hgetall_with_ttl: a string": ("WrongType", "hgetall_with_ttl", ("STR",), {}),
    "delete and exists: any kind": ("ok", "delete", ("S", "STR", "H", "E"), {}),
    # scripts (store/scripts.py): each error code, and redis.call's errors inside them
    "commit: a stale epoch": (
        "ScriptFailed",
        "script",
        ("commit", ["F", "S", "N", "CUR"], [0, "", "g", 1, "S#0", 0, "", 3, b"e", ""]),
        {},
    ),
    "commit: another server's run id": (
        "ScriptFailed",
        "script",
        ("commit", ["F", "S", "N", "CUR"], [3, "no-such-run", "g", 1, "S#0", 0, "", 3, b"e", ""]),
        {},
    ),
    "commit: a bad cursor": (
        "ScriptFailed",
        "script",
        ("commit", ["F", "S", "N", "CUR"], [3, "", "g", 1, "S#0", 4, "x", 3, b"e", ""]),
        {},
    ),
    "commit: the cursor is appended to": (
        "ScriptFailed",
        "script",
        ("commit", ["F", "S", "N", "CUR"], [3, "", "g", 1, "S#0", 3, "1-0", 3, b"e", ""]),
        {},
    ),
    "commit: appending to a key of another kind": (
        "ScriptFailed",
        "script",
        ("commit", ["F", "S", "STR", "CUR"], [3, "", "g", 1, "S#0", 0, "", 3, b"e", ""]),
        {},
    ),
    "commit: an entry consumed twice": (
        "ScriptFailed",
        "script",
        ("commit", ["F", "S", "N", "CUR"], [3, "", "g", 2, "S#0", "S#0", 0, "", 3, b"e", ""]),
        {},
    ),
    "commit: consuming from a key of another kind": (
        "ScriptFailed",
        "script",
        ("commit", ["F", "STR", "N", "CUR"], [3, "", "g", 1, "1-0", 0, "", 3, b"e", ""]),
        {},
    ),
    "commit: one entry of a missing group is a duplicate": (
        "ok",
        "script",
        ("commit", ["F", "N", "S", "CUR"], [3, "", "g", 1, "N#0", 0, "", 3, b"e", ""]),
        {},
    ),
    "commit: two entries of a missing group": (
        "ScriptFailed",
        "script",
        ("commit", ["F", "N", "S", "CUR"], [3, "", "g", 2, "N#0", "1-0", 0, "", 3, b"e", ""]),
        {},
    ),
    "commit: a consumed id that is not an id": (
        "ScriptFailed",
        "script",
        ("commit", ["F", "S", "N", "CUR"], [3, "", "g", 1, "x", 0, "", 3, b"e", ""]),
        {},
    ),
    "fence: a stale epoch": ("ScriptFailed", "script", ("fence", ["F"], [1, ""]), {}),
    "fence: a key of another kind": ("ScriptFailed", "script", ("fence", ["H"], [1, ""]), {}),
    "dead_letter: a missing group": (
        "ScriptFailed",
        "script",
        ("dead_letter", ["N", "DEAD"], ["g", "N#0", "k", "r"]),
        {},
    ),
    "dead_letter: a dead-letter key of another kind": (
        "ScriptFailed",
        "script",
        ("dead_letter", ["S", "STR"], ["g", "S#0", "k", "r"]),
        {},
    ),
    "dead_letter: not pending": ("ok", "script", ("dead_letter", ["S", "DEAD"], ["g", "S#1", "k", "r"]), {}),
    "deliver: a target of another kind": (
        "ScriptFailed",
        "script",
        ("deliver", ["STR", "DEL"], ["", "o", "1-0", b"e"]),
        {},
    ),
    "deliver: marks of another kind": ("ScriptFailed", "script", ("deliver", ["E", "STR"], ["", "o", "1-0", b"e"]), {}),
    "deliver: another server's run id": (
        "ScriptFailed",
        "script",
        ("deliver", ["E", "DEL"], ["no-such-run", "o", "1-0", b"e"]),
        {},
    ),
    "advance_cursor: a cursor of another kind": ("ScriptFailed", "script", ("advance_cursor", ["H"], ["", "1-0"]), {}),
    "advance_cursor: a cursor that is not an id": (
        "ScriptFailed",
        "script",
        ("advance_cursor", ["STR"], ["", "1-0"]),
        {},
    ),
    "lease_acquire: a lease of another kind": (
        "ScriptFailed",
        "script",
        ("lease_acquire", ["STR", "E", "F"], ["a", TEN_MINUTES]),
        {},
    ),
    "lease_acquire: an epoch counter that is not a number": (
        "ScriptFailed",
        "script",
        ("lease_acquire", ["E", "STR", "F"], ["a", TEN_MINUTES]),
        {},
    ),
    "lease_renew: another server's run id": (
        "ScriptFailed",
        "script",
        ("lease_renew", ["E"], ["a", 1, 100, "no-such-run"]),
        {},
    ),
    "lease_release: a lease of another kind": ("ScriptFailed", "script", ("lease_release", ["STR"], ["a", 1]), {}),
    "project: a table of another kind": (
        "ScriptFailed",
        "script",
        ("project", ["P", "STR"], ["", "", "1-0", 1, "x", b"v"]),
        {},
    ),
    "project: a position of another kind": ("ScriptFailed", "script", ("project", ["H", "P"], ["", "", "1-0", 0]), {}),
    "snapshot: a stale epoch": ("ScriptFailed", "script", ("snapshot", ["F", "S", "SNAP"], [1, "", b"data"]), {}),
    "snapshot: facts of another kind": (
        "ScriptFailed",
        "script",
        ("snapshot", ["F", "STR", "SNAP"], [3, "", b"data"]),
        {},
    ),
    "snapshot: a snapshot of another kind": (
        "ScriptFailed",
        "script",
        ("snapshot", ["F", "S", "STR"], [3, "", b"data"]),
        {},
    ),
    "set_aside: a string is moved, the inbox made with its group": (
        "ok",
        "script",
        ("set_aside", ["STR", "ASIDE"], ["g"]),
        {},
    ),
    "set_aside: a stream stays": ("ok", "script", ("set_aside", ["S", "ASIDE"], ["g"]), {}),
    "set_aside: a missing inbox from a writer stays missing": ("ok", "script", ("set_aside", ["E", "ASIDE"], [""]), {}),
    "set_aside: over a key of another kind": ("ok", "script", ("set_aside", ["H", "STR"], ["g"]), {}),
    "script_many: an error takes its call's place": (
        "ok",
        "script_many",
        ([("fence", ["F"], [1, ""]), ("fence", ["F"], [4, ""])],),
        {},
    ),
}


def _roles(t: Twins) -> dict[str, str]:
    inbox, facts, dead, tm_inbox = t.streams
    s, h, _, _, fence, pos, delivered, cursor, snapshot, aside = t.others
    return {
        "S": inbox,
        "N": facts,
        "E": tm_inbox,
        "DEAD": dead,
        "STR": s,
        "H": h,
        "F": fence,
        "P": pos,
        "DEL": delivered,
        "CUR": cursor,
        "SNAP": snapshot,
        "ASIDE": aside,
        "PREFIX*": inbox[: inbox.index(":") + 1] + "*",
    }


def _resolve(value: Any, t: Twins, roles: dict[str, str]) -> Any:
    """A case's arguments with its roles (and ``S#0``: S's first entry) made keys and ids."""
    if isinstance(value, str):
        role, _, n = value.partition("#")
        if n:
            return t.ids(roles[role])[int(n)]
        return roles.get(value, value)
    if isinstance(value, list):
        return [_resolve(v, t, roles) for v in value]
    if isinstance(value, tuple):
        return tuple(_resolve(v, t, roles) for v in value)
    if isinstance(value, dict):
        return {_resolve(k, t, roles): _resolve(v, t, roles) for k, v in value.items()}
    return value


@pytest.mark.parametrize("case", list(ERROR_PATHS), ids=list(ERROR_PATHS))
def test_each_error_path_is_the_same_on_the_twin_and_on_redis(redis_url: str, case: str) -> None:
    expected, method, args, kwargs = ERROR_PATHS[case]
    t = Twins(redis_url, _prefix())
    roles = _roles(t)
    s, n = roles["S"], roles["N"]
    try:
        for _ in range(2):
            t.call("xadd", s, {b"n": b"1"}, home=s)
        t.call("group_create", s, "g", "0", home=s)
        t.call("xreadgroup", "g", "a", {s: ">"}, count=1, block_ms=None, home=s)
        t.call("xadd", n, {b"n": b"1"}, home=n)
        t.call("set", roles["STR"], b"v", home=s)
        t.call("hset", roles["H"], {"x": b"1"}, home=s)
        t.call("script", "fence", [roles["F"]], [3, ""], home=s)
        args, kwargs = _resolve(args, t, roles), _resolve(kwargs, t, roles)
        keys = args[1] if method == "script" else [*args[:1], *(args[0] if isinstance(args[0], dict) else ())]
        home = next((k for k in keys if k in t.streams), s)  # whose ids the arguments hold
        reply_home = {"commit": 2, "dead_letter": 1}.get(args[0]) if method == "script" else None
        outcome = t.call(
            method, *args, home=home, reply_home=None if reply_home is None else keys[reply_home], **kwargs
        )
        assert (outcome[1] if outcome[0] == "error" else "ok") == expected, outcome
    finally:
        t.close()


# --- random sequences of calls -----------------------------------------------------------------


def differential_call(rng: random.Random, t: Twins) -> None:
    """One random call of the kinds Sluice makes, on a few keys that change kind (errors are
    part of it), compared on both servers."""
    inbox, facts, dead, tm_inbox = t.streams
    string, table, leader, epoch, fence, pos, delivered, cursor, snapshot, aside = t.others
    s = rng.choice([inbox, inbox, facts, facts, dead, tm_inbox, string])
    ids = t.ids(s)
    pick = rng.sample(ids, min(len(ids), rng.randint(1, 3))) if ids and rng.random() < 0.9 else ["1-0"]
    bad = rng.choice(["x", "-", "+", "5", "0", _BIG, "$", ">"])
    if rng.random() < 0.1:  # an id a command may refuse
        pick[0] = bad
    group, consumer = rng.choice(t.groups), rng.choice(["a", "b"])
    choice = rng.randrange(30)
    if choice < 4:
        maxlen = rng.choice([None, None, None, -1, 0, 1000])
        t.call("xadd", s, {b"n": str(rng.randint(0, 9)).encode(), b"m": b"x"}, maxlen=maxlen, home=s)
    elif choice == 4:
        target = rng.choice(t.streams)
        items = [(rng.choice([target, target, string]), {b"n": b"x"}) for _ in range(rng.randint(1, 4))]
        if rng.random() < 0.1:
            items[-1] = (target, {})
        t.call("xadd_many", items, home=target)
    elif choice == 5:
        t.call("group_create", s, group, rng.choice(["0", "$", pick[0]]), home=s)
    elif choice in (6, 7, 8):
        t.call(
            "xreadgroup",
            group,
            consumer,
            {s: rng.choice([">", ">", "0", pick[0]])},
            count=rng.randint(0, 5),
            block_ms=None,
            home=s,
        )
    elif choice == 9:  # the leader reads as the group's sole consumer: others' pending counted too
        t.call(
            rng.choice(["xreadgroup", "xreadgroup_sole"]),
            group,
            consumer,
            {inbox: rng.choice([">", "0"]), facts: ">"},
            count=rng.randint(1, 5),
            block_ms=None,
            ack={inbox: pick} if rng.random() < 0.3 else None,
            home=inbox,
        )
    elif choice == 10:
        t.call(
            "xautoclaim",
            s,
            group,
            consumer,
            min_idle_ms=rng.choice([0, TEN_MINUTES, -1]),
            start=rng.choice(["0-0", pick[0]]),
            count=rng.choice([1, 2, 3, 3, 0, -1]),
            home=s,
        )
    elif choice == 11:
        t.call("xack", s, group, pick, home=s)
    elif choice == 12:
        t.call("xtrim_minid", s, rng.choice(pick), home=s)
    elif choice == 13:
        t.call("group_setid", s, group, rng.choice(["0", "$", pick[0]]), home=s)
    elif choice == 14:
        t.call("group_state", s, group, home=s)
        t.call("xlen", s, home=s)
        t.call("last_id", s, home=s)
    elif choice == 15:
        t.call("xrange", s, rng.choice([None, "0", pick[0]]), rng.randint(-1, 5), home=s)
        t.call(
            "xread", {s: rng.choice(["0", "$", pick[0]]), facts: "0"}, count=rng.randint(0, 5), block_ms=None, home=s
        )
    elif choice == 16:  # keys change kind (facts or the target inbox), and WRONGTYPE follows
        key = rng.choice([string, table, leader, facts, tm_inbox, epoch, fence, cursor, pos, snapshot])
        value = rng.choice([str(rng.randint(0, 3)), "x", "7-1", ""]).encode()
        t.call("set", key, value, nx=rng.random() < 0.5, home=s)
    elif choice == 17:
        t.call(
            "delete",
            *rng.sample([string, table, leader, epoch, fence, pos, facts, tm_inbox, aside], rng.randint(1, 2)),
            home=s,
        )
    elif choice == 18:
        fields = ["x", "y", "z", "holder", "epoch"]
        t.call(
            "hset",
            rng.choice([string, table, facts, leader, delivered, snapshot]),
            {rng.choice(fields): b"1", rng.choice(fields): rng.choice([b"2", b"a", b"x"])},
            home=s,
        )
        key = rng.choice([string, table, leader, facts])
        t.call("hget", key, "x", home=s)
        t.call("hgetall", key, home=s)
        t.call("hkeys", key, home=s)
        t.call("get", key, home=s)
        t.call("exists", key, key, s, home=s)
        t.call("get_and_hgetall", rng.choice([pos, table]), rng.choice([table, string]), home=s)
        t.call("hgetall_with_ttl", rng.choice([leader, string]), home=s)
        t.call(
            "scan_streams", inbox[: inbox.index(":") + 1] + "*", home=s
        )  # its own prefix: other tests share the server
    elif choice == 19:
        t.call("script", "lease_acquire", [leader, epoch, fence], [consumer, rng.choice([0, TEN_MINUTES])], home=s)
    elif choice == 20:
        t.call("script", "lease_renew", [leader], [consumer, rng.randint(0, 3), TEN_MINUTES, ""], home=s)
        t.call("script", "lease_release", [leader], [consumer, rng.randint(0, 3)], home=s)
    elif choice == 21:
        t.call("script", "fence", [fence], [rng.randint(0, 5), ""], home=s)
    elif choice in (22, 23):  # consume from s, write to facts
        outs = [v for _ in range(rng.randint(0, 2)) for v in (3, b"e", rng.choice(["", "to"]))]
        consumed = pick if rng.random() < 0.8 else pick[:1] * 2
        advance = rng.choice(
            [
                (0, ""),
                (0, ""),
                (4, rng.choice(["3-0", "7-1", "12-5"])),
                (4, "x"),
                (2, "3-0"),
                (5, "3-0"),
                ("", ""),
                ("3.5", "3-0"),
                (3, "3-0"),
            ]
        )  # none, a good one, refused ones
        reply = t.call(
            "script",
            "commit",
            [fence, s, facts, cursor],
            [rng.randint(0, 5), "", rng.choice(["", group]), len(consumed), *consumed, *advance, *outs],
            home=s,
            reply_home=facts,
        )
        assert reply[0] == "error" or reply[1][0] in (b"OK", b"DUP")
    elif choice == 24:
        t.call(
            "script",
            "dead_letter",
            [inbox, dead],
            [rng.choice(["", group]), rng.choice(t.ids(inbox) or ["1-0"]), "k", "r", "f", b"v"],
            home=inbox,
            reply_home=dead,
        )
    elif choice == 25:
        target = rng.choice([tm_inbox, string, table])
        refs = sorted(rng.sample(range(1, 30), rng.randint(1, 3)))
        t.call(
            "script",
            "deliver",
            [target, delivered],
            ["", "o", *[v for r in refs for v in (f"{r}-{rng.randint(0, 1)}", b"e")]],
            home=target,
        )
        t.call("script", "advance_cursor", [cursor], ["", f"{rng.randint(0, 9)}-{rng.randint(0, 9)}"], home=s)
    elif choice == 26:
        covered = rng.choice([facts, string])
        t.call(
            "script",
            "snapshot",
            [fence, covered, rng.choice([snapshot, table])],
            [rng.randint(0, 5), "", b"state"],
            home=covered,
        )
    elif choice == 27:
        t.call("script", "set_aside", [rng.choice([inbox, facts, tm_inbox]), aside], [rng.choice(["", group])], home=s)
    else:
        t.call(
            "script",
            "project",
            [pos, rng.choice([string, table])],
            [
                "",
                rng.choice(["", "1-0", "2-0"]),
                rng.choice(["1-0", "2-0"]),
                1,
                rng.choice("xyz"),
                b"v",
                rng.choice("xyz"),
            ],
            home=s,
        )


@pytest.mark.parametrize("seed", range(4))
def test_the_memory_store_answers_like_redis(redis_url: str, seed: int) -> None:
    twins = Twins(redis_url, _prefix())
    rng = random.Random(seed)
    try:
        for _ in range(250):
            differential_call(rng, twins)
    finally:
        twins.close()


def test_random_sequences_of_calls_agree_after_every_call(redis_url: str) -> None:
    """Hypothesis drives the calls (and shrinks a disagreement to the fewest calls)."""

    class TwinMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.twins = Twins(redis_url, _prefix())

        @rule(rng=st.randoms(use_true_random=False))
        def call(self, rng: random.Random) -> None:
            differential_call(rng, self.twins)

        def teardown(self) -> None:
            self.twins.close()

    run_state_machine_as_test(
        TwinMachine,
        settings=settings(
            max_examples=15, stateful_step_count=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
        ),
    )
