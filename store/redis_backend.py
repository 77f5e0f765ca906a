"""The backend every Sluice process uses: a real Redis through redis-py.

Connection failures become :class:`~sluice.errors.RedisUnavailable` naming what we were
doing; error replies of scripts become :class:`~sluice.store.backend.ScriptFailed`; error
replies of commands become what the in-memory twin raises for them (``refusal``):
WRONGTYPE :class:`~sluice.errors.WrongType`, a missing group or stream
:class:`~sluice.errors.NoGroup`, anything else :class:`~sluice.errors.CommandError`, so a
caller handles one set of errors whichever backend it runs on (tests/store/test_twin_vs_redis.py).
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, cast

import redis

from sluice.errors import CommandError, PartlyAppended, RedisUnavailable, StoreError, WrongType

from . import scripts
from .backend import Backend, Fields, GroupState, NoGroup, RawEntry, ScriptCall, ScriptFailed

__all__ = [
    "RedisBackend",
    "translate_errors",
    "asking",
    "xread_command",
    "xreadgroup_command",
    "read_reply",
    "others_pending",
    "refusal",
]

_ASKING = threading.local()


@contextlib.contextmanager
def asking() -> Iterator[None]:
    """Calls made through ``_raw`` in this block (on this thread) are preceded by ASKING on
    their connection: a Redis Cluster node that imports a slot serves them (the ASK
    redirection of a slot in migration; store/cluster_backend.py)."""
    _ASKING.on = True
    try:
        yield
    finally:
        _ASKING.on = False


@contextlib.contextmanager
def translate_errors(what: str) -> Iterator[None]:
    """Turn redis-py's connection errors into RedisUnavailable naming ``what`` we were doing."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise RedisUnavailable(f"Redis went away while {what}: {exc}") from exc


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


# What redis-py returns on the connections Sluice makes (RESP2, bytes: decode_responses is
# off). Its annotations also allow str and RESP3's dict shapes, which these never get.
_Entries = list[tuple[bytes, Fields]]


def _arg(mapping: Mapping[str, Any] | Mapping[bytes, Any]) -> dict[Any, Any]:
    """A copy of ``mapping`` to pass to redis-py, whose parameters are dicts invariant in
    the key type (a ``dict[str, str]`` is not a ``dict[KeyT, StreamIdT]``)."""
    return dict(mapping)


def _fields(flat: list[bytes]) -> Fields:
    """An entry's fields from Redis's flat list. Commits write one field per entry: a literal
    dict for those (3x cheaper than zip)."""
    return {flat[0]: flat[1]} if len(flat) == 2 else dict(zip(flat[::2], flat[1::2]))


def _xadd(stream: str, fields: Mapping[bytes, bytes], maxlen: int | None) -> list[Any]:
    command: list[Any] = ["XADD", stream]
    if maxlen is not None:
        command += ("MAXLEN", "~", maxlen)
    command.append("*")
    for k, v in fields.items():
        command += (k, v)
    return command


_IN_PIPELINE = re.compile(r"Command # \d+ \(.*?\) of pipeline caused error: ", re.DOTALL)
_NO_KEY = "The XGROUP subcommand requires the key to exist"


def refusal(exc: redis.ResponseError) -> StoreError:
    """The error a command's error reply means, as the in-memory twin raises it (raise it
    ``from exc``): WRONGTYPE is WrongType; NOGROUP, XGROUP's missing key and a blocked read
    whose stream was deleted (UNBLOCKED) are NoGroup; anything else (an invalid id or
    argument, READONLY, OOM, ...) is CommandError. Its text is Redis's (redis-py's prefix
    naming a transaction's command dropped)."""
    text = _IN_PIPELINE.sub("", str(exc), count=1)
    if text.startswith("WRONGTYPE"):
        return WrongType(text)
    if text.startswith(("NOGROUP", "UNBLOCKED", _NO_KEY)):
        return NoGroup(text)
    return CommandError(text)


@contextlib.contextmanager
def _command(what: str) -> Iterator[None]:
    """``translate_errors``, and a command's error reply raised as ``refusal`` says."""
    with translate_errors(what):
        try:
            yield
        except redis.ResponseError as exc:
            raise refusal(exc) from exc


def xread_command(positions: Mapping[str, str], count: int, block_ms: int | None) -> list[Any]:
    command: list[Any] = ["XREAD", "COUNT", count]
    if block_ms:  # 0 means "don't wait" here (to Redis, BLOCK 0 waits for ever)
        command += ("BLOCK", block_ms)
    command += ("STREAMS", *positions.keys(), *positions.values())
    return command


def xreadgroup_command(
    group: str, consumer: str, streams: Mapping[str, str], count: int, block_ms: int | None
) -> list[Any]:
    command: list[Any] = ["XREADGROUP", "GROUP", group, consumer, "COUNT", count]
    if block_ms:  # 0 means "don't wait" here (to Redis, BLOCK 0 waits for ever)
        command += ("BLOCK", block_ms)
    command += ("STREAMS", *streams.keys(), *streams.values())
    return command


def read_reply(reply: Any) -> list[tuple[str, str, Fields | None]]:
    """XREAD's or XREADGROUP's reply as (stream, entry id, fields; None for an entry deleted
    while pending), in the order Redis sent them."""
    return [
        (name, raw_id.decode(), _fields(flat) if flat else None)
        for stream, entries in (reply.items() if isinstance(reply, dict) else reply or ())  # RESP3: a map
        for name in (_s(stream),)
        for raw_id, flat in entries
    ]


def others_pending(consumer: str, streams: Sequence[str], summaries: Sequence[Any]) -> dict[str, int]:
    """From the XPENDING summaries of ``streams`` (in order): how many entries consumers other
    than ``consumer`` hold pending on each (only streams where some do)."""
    others: dict[str, int] = {}
    for stream, summary in zip(streams, summaries):
        # [count, min, max, [[consumer, count], ...]]; an error (the group went since): none
        if isinstance(summary, list) and summary and summary[0] and summary[3]:
            n = sum(int(c) for name, c in summary[3] if _s(name) != consumer)
            if n:
                others[stream] = n
    return others


class RedisBackend(Backend):
    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._scripts = {name: client.register_script(scripts.BY_NAME[name]) for name in scripts.BY_NAME}

    # --- the server ---
    def server_id(self) -> str:
        with translate_errors("reading the server's run id"):
            return str(self.client.info("server")["run_id"])

    def time_ms(self) -> int:
        with translate_errors("reading the server's clock"):
            sec, usec = self.client.time()
        return int(sec) * 1000 + int(usec) // 1000

    def describe(self) -> str:
        kw = self.client.connection_pool.connection_kwargs
        if "path" in kw:
            return f"unix://{kw['path']}"
        return f"redis://{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"

    def address(self) -> str | None:
        return self.describe()

    def durable(self) -> bool:
        with translate_errors("reading the server's persistence settings"):
            try:
                conf = self.client.config_get("append*")
            except redis.ResponseError:  # CONFIG renamed or refused (managed Redis): assume the worst
                return False
        return conf.get("appendonly") == "yes" and conf.get("appendfsync") == "always"

    def close(self) -> None:
        self.client.close()

    # --- strings and hashes ---
    def get(self, key: str) -> bytes | None:
        with _command(f"reading {key}"):
            return cast("bytes | None", self.client.get(key))

    def set(self, key: str, value: bytes, *, nx: bool = False) -> bool:
        with _command(f"writing {key}"):
            return bool(self.client.set(key, value, nx=nx))

    def exists(self, *keys: str) -> int:
        with translate_errors(f"looking for {', '.join(keys)}"):
            return int(self.client.exists(*keys))

    def delete(self, *keys: str) -> int:
        if not keys:
            return 0
        with translate_errors(f"deleting {len(keys)} key(s)"):
            return int(self.client.delete(*keys))

    def hget(self, key: str, field: str) -> bytes | None:
        with _command(f"reading {key}"):
            return cast("bytes | None", self.client.hget(key, field))

    def hgetall(self, key: str) -> dict[bytes, bytes]:
        with _command(f"reading {key}"):
            return dict(cast("dict[bytes, bytes]", self.client.hgetall(key)))

    def hkeys(self, key: str) -> list[bytes]:
        with _command(f"reading {key}"):
            return list(cast("list[bytes]", self.client.hkeys(key)))

    def hset(self, key: str, mapping: Mapping[str, bytes]) -> int:
        if not mapping:
            return 0
        with _command(f"writing {key}"):
            return int(self.client.hset(key, mapping=_arg(mapping)))

    def hdel(self, key: str, *fields: str) -> int:
        if not fields:
            return 0
        with translate_errors(f"writing {key}"):
            return int(self.client.hdel(key, *fields))

    def get_and_hgetall(self, key: str, hash_key: str) -> tuple[bytes | None, dict[bytes, bytes]]:
        with _command(f"reading {key} and {hash_key}"):
            pipe = self.client.pipeline(transaction=True)
            pipe.get(key)
            pipe.hgetall(hash_key)
            value, rows = pipe.execute()
        return value, dict(rows)

    def hgetall_with_ttl(self, key: str) -> tuple[dict[bytes, bytes], int]:
        with _command(f"reading {key}"):
            pipe = self.client.pipeline(transaction=True)
            pipe.hgetall(key)
            pipe.pttl(key)
            fields, ttl = pipe.execute()
        return dict(fields), int(ttl)

    # --- raw commands ---
    def _raw(self, what: str, commands: Sequence[Sequence[Any]], *, check: bool = True) -> list[Any]:
        """Send ``commands`` in one round trip on a pooled connection and read their replies
        as Redis sends them (RESP2), without redis-py's per-command machinery: the calls every
        message makes (append, acknowledge, read a batch) spend a third of their CPU there,
        and a 2 x 10,000 deployment makes some 250,000 of them. The first error reply raises
        (as ``refusal`` says) once every reply is read, so the connection stays usable;
        anything else drops the connection (its replies are unknown). ``check=False``: error
        replies are returned in their commands' places instead (``check``: the first is
        raised as ``refusal`` says)."""
        pool = self.client.connection_pool
        ask = getattr(_ASKING, "on", False)
        if ask:
            commands = [("ASKING",), *commands]
        with translate_errors(what):
            conn = pool.get_connection()
            try:
                if len(commands) == 1:
                    conn.send_command(*commands[0])
                else:
                    conn.send_packed_command(conn.pack_commands(commands))
                replies: list[Any] = []
                error: redis.ResponseError | None = None
                for _ in commands:
                    try:
                        replies.append(conn.read_response())
                    except redis.ResponseError as exc:
                        error = error or exc
                        replies.append(exc)
            except BaseException:
                conn.disconnect()
                raise
            finally:
                pool.release(conn)
        if error is not None and check:
            raise refusal(error) from error
        return replies[1:] if ask else replies

    # --- streams ---
    def xadd(self, stream: str, fields: Mapping[bytes, bytes], *, maxlen: int | None = None) -> str:
        return _s(self._raw(f"appending to {stream}", [_xadd(stream, fields, maxlen)])[0])

    def xadd_many(self, items: Sequence[tuple[str, Mapping[bytes, bytes]]]) -> list[str]:
        if not items:
            return []
        what = f"appending to {items[0][0]}" + (" and others" if len(items) > 1 else "")
        commands = [_xadd(stream, fields, None) for stream, fields in items]
        if len(commands) == 1:
            replies = self._raw(what, commands, check=False)
        else:  # MULTI/EXEC: readers see all of them or none (a reader blocked on one stream
            # is not woken between two of them), in the same round trip
            *queued, done = self._raw(what, [("MULTI",), *commands, ("EXEC",)], check=False)[1:]
            refused = next((r for r in queued if isinstance(r, redis.ResponseError)), None)
            if refused is not None:  # refused before it ran (the transaction is aborted): nothing was appended
                raise refusal(refused) from refused
            if isinstance(done, redis.ResponseError):
                raise refusal(done) from done
            replies = list(done)
        errors = {i: str(r) for i, r in enumerate(replies) if isinstance(r, redis.ResponseError)}
        other = next((i for i, text in errors.items() if not text.startswith("WRONGTYPE")), None)
        if other is not None:  # READONLY, OOM, ...: not a refusal of one key (the caller sends them all again)
            raise refusal(replies[other]) from replies[other]
        if errors:
            raise PartlyAppended([None if i in errors else _s(r) for i, r in enumerate(replies)], errors)
        return [_s(i) for i in replies]

    def xrange(self, stream: str, after: str | None, count: int) -> list[RawEntry]:
        """XRANGE as Redis sends it, without redis-py's per-entry dict building (replay reads
        millions of entries; that is a third of its cost)."""
        start = "(" + after if after not in (None, "0", "0-0", "-") else "-"
        batch = self._raw(f"reading {stream}", [("XRANGE", stream, start, "+", "COUNT", count)])[0]
        return [(raw_id.decode(), _fields(flat)) for raw_id, flat in batch or ()]  # (COUNT 0: a null reply)

    def last_id(self, stream: str) -> str | None:
        with _command(f"reading {stream}"):
            last = cast(_Entries, self.client.xrevrange(stream, "+", "-", count=1))
        return _s(last[0][0]) if last else None

    def xlen(self, stream: str) -> int:
        with _command(f"reading {stream}"):
            return int(self.client.xlen(stream))

    def xread(self, positions: Mapping[str, str], *, count: int, block_ms: int | None) -> list[tuple[str, str, Fields]]:
        if not positions:
            return []
        reply = self._raw("following " + ", ".join(positions), [xread_command(positions, count, block_ms)])[0]
        return cast("list[tuple[str, str, Fields]]", read_reply(reply))

    def xtrim_minid(self, stream: str, minid: str) -> int:
        with _command(f"trimming {stream}"):
            return int(self.client.xtrim(stream, minid=minid, approximate=False))

    def scan_streams(self, pattern: str) -> list[str]:
        with translate_errors("listing streams"):
            return [_s(k) for k in self.client.scan_iter(match=pattern, count=1000, _type="stream")]

    def scan_keys(self, pattern: str) -> list[str]:
        with translate_errors("listing keys"):
            return [_s(k) for k in self.client.scan_iter(match=pattern, count=1000)]

    # --- consumer groups ---
    def group_create(self, stream: str, group: str, start: str) -> None:
        with _command(f"creating group {group} on {stream}"):
            try:
                self.client.xgroup_create(stream, group, id=start, mkstream=True)
            except redis.ResponseError as exc:
                if not str(exc).startswith("BUSYGROUP"):
                    raise

    def group_setid(self, stream: str, group: str, start: str) -> None:
        with _command(f"moving group {group} on {stream}"):  # NoGroup: the group or its stream is gone
            self.client.xgroup_setid(stream, group, start)

    def group_state(self, stream: str, group: str) -> GroupState | None:
        with translate_errors(f"reading group {group} of {stream}"):
            try:
                groups = self.client.xinfo_groups(stream)
            except redis.ResponseError:
                return None  # no such stream
            mine = [g for g in groups if _s(g["name"]) == group]
            if not mine:
                return None
            try:
                pending = self.client.xpending(stream, group)
            except redis.ResponseError:
                return None  # gone (or made another kind of key) since
        count = int(pending.get("pending") or 0) if pending else 0
        return GroupState(_s(mine[0]["last-delivered-id"]), count, _s(pending["min"]) if count else None)

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
        return self._xreadgroup(group, consumer, streams, count, block_ms, ack, sole=False)[0]

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
        return self._xreadgroup(group, consumer, streams, count, block_ms, ack, sole=True)

    def _xreadgroup(
        self,
        group: str,
        consumer: str,
        streams: Mapping[str, str],
        count: int,
        block_ms: int | None,
        ack: Mapping[str, Sequence[str]] | None,
        *,
        sole: bool,
    ) -> tuple[list[tuple[str, str, Fields | None]], dict[str, int]]:
        """``sole``: an XPENDING summary of each stream follows the read in the same round
        trip (after it, even when it blocked: a client's pipelined commands run in order)."""
        # An acknowledgement Redis refuses (its stream or group is gone) has nothing left to
        # acknowledge: its error is dropped, so that it cannot hide what the read took.
        acks: list[Sequence[Any]] = [("XACK", s, group, *ids) for s, ids in (ack or {}).items() if ids]
        if not streams:
            if acks:
                self._raw("acknowledging on " + ", ".join(ack or {}), acks, check=False)
            return [], {}
        command = xreadgroup_command(group, consumer, streams, count, block_ms)
        checks = [("XPENDING", s, group) for s in streams] if sole else []
        try:
            replies = self._raw("reading " + ", ".join(streams), [*acks, command, *checks], check=False)
            reply = replies[len(acks)]
            if isinstance(reply, redis.ResponseError):
                raise reply
        except redis.ResponseError as exc:  # NoGroup too for a stream deleted while we read (UNBLOCKED)
            raise refusal(exc) from exc
        return read_reply(reply), others_pending(consumer, list(streams), replies[len(acks) + 1 :])

    def xautoclaim(
        self, stream: str, group: str, consumer: str, *, min_idle_ms: int, start: str, count: int
    ) -> tuple[str, list[tuple[str, Fields | None]]]:
        # Through ``_raw``: the server judges the arguments (redis-py refuses some itself).
        command = ("XAUTOCLAIM", stream, group, consumer, min_idle_ms, start, "COUNT", count)
        cursor, claimed, *_ = self._raw(f"reclaiming from {stream}", [command])[0]
        entries = [(raw_id.decode(), _fields(flat) if flat else None) for raw_id, flat in claimed]
        return _s(cursor), entries

    def xack(self, stream: str, group: str, ids: Sequence[str]) -> int:
        if not ids:
            return 0
        return int(self._raw(f"acknowledging on {stream}", [("XACK", stream, group, *ids)])[0])

    # --- scripts ---
    def script(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """EVALSHA through ``_raw`` (redis-py's Script call costs a leader's commit a fifth
        of its CPU); a server that lost the script answers NOSCRIPT, and the call goes again
        with the script's text (EVAL, which caches it again)."""
        script = self._scripts[name]
        what = f"running script {name} on {keys[0] if keys else '?'}"
        reply = self._raw(what, [("EVALSHA", script.sha, len(keys), *keys, *args)], check=False)[0]
        if isinstance(reply, redis.exceptions.NoScriptError):
            reply = self._raw(what, [("EVAL", script.script, len(keys), *keys, *args)], check=False)[0]
        if isinstance(reply, redis.ResponseError):
            raise ScriptFailed(str(reply)) from reply
        return reply

    def script_many(self, calls: Sequence[ScriptCall]) -> list[Any]:
        if not calls:
            return []
        what = f"running {len(calls)} scripts ({calls[0][0]} on {calls[0][1][0] if calls[0][1] else '?'} ...)"
        out: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        # EVALSHA through ``_raw`` (redis-py's pipeline machinery was a third of what a
        # leader's delivery costs it). A script the server lost comes back NOSCRIPT; those
        # calls go again, in order, with the script's text (EVAL, which caches it again).
        for load in (False, True):
            commands = []
            for i in todo:
                name, keys, args = calls[i]
                script = self._scripts[name]
                head = ("EVAL", script.script) if load else ("EVALSHA", script.sha)
                commands.append((*head, len(keys), *keys, *args))
            replies = self._raw(what, commands, check=False)
            again: list[int] = []
            for i, reply in zip(todo, replies):
                if not load and isinstance(reply, redis.exceptions.NoScriptError):
                    again.append(i)
                elif isinstance(reply, redis.ResponseError):
                    failed = out[i] = ScriptFailed(str(reply))
                    failed.__cause__ = reply  # (a cluster's redirection is told by it)
                else:
                    out[i] = reply
            todo = again
            if not todo:
                break
        return out
