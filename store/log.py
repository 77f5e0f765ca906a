"""The event log: appends, atomic fenced commits, paged replay and following of streams.

Every method that talks to Redis translates connection failures into
:class:`~sluice.errors.RedisUnavailable`, and a refused epoch into
:class:`~sluice.errors.StaleEpoch`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Sequence

import redis

from sluice.errors import DecodeError, RedisUnavailable, ScriptError, StaleEpoch, StoreError
from sluice.events import FIELD, Envelope, decode_bytes, decode_fields, encode

from . import scripts
from .keys import Keys, tag_of

__all__ = ["EventLog", "Out", "Consumed", "CommitResult", "translate_errors", "entry_order"]


@contextlib.contextmanager
def translate_errors(what: str) -> Iterator[None]:
    """Turn redis-py's connection errors into RedisUnavailable naming ``what`` we were doing."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise RedisUnavailable(f"Redis went away while {what}: {exc}") from exc


@dataclass(frozen=True, slots=True)
class Out:
    """One event a commit appends: to ``stream``, and when ``to`` is set, as an outbox
    entry addressed to the inbox ``to`` of another tag."""

    stream: str
    envelope: Envelope
    to: str | None = None


@dataclass(frozen=True, slots=True)
class Consumed:
    """The inbox entry (or entries, in order) a commit acknowledges."""

    stream: str
    group: str
    entry_id: str | tuple[str, ...]

    @property
    def ids(self) -> tuple[str, ...]:
        return (self.entry_id,) if isinstance(self.entry_id, str) else self.entry_id


@dataclass(frozen=True, slots=True)
class CommitResult:
    duplicate: bool
    ids: tuple[str, ...] = ()


class EventLog:
    """Sluice's view of the Redis streams. One per process; cheap to share between threads
    (redis-py's pool hands each call its own connection)."""

    def __init__(self, client: redis.Redis, keys: Keys | None = None) -> None:
        self.client = client
        self.keys = keys or Keys()
        self._commit = client.register_script(scripts.COMMIT)
        self._fence = client.register_script(scripts.FENCE)

    # --- writing -------------------------------------------------------------------------

    def append(self, stream: str, env: Envelope, *, maxlen: int | None = None) -> str:
        """Append one message to a stream (an inbox), unfenced: for senders that are not leaders."""
        with translate_errors(f"appending to {stream}"):
            return _s(self.client.xadd(stream, {FIELD: encode(env)}, maxlen=maxlen, approximate=True))

    def append_batch(self, stream: str, envs: Sequence[Envelope]) -> list[str]:
        """Append several messages in one round trip, in order."""
        with translate_errors(f"appending to {stream}"):
            pipe = self.client.pipeline(transaction=False)
            for env in envs:
                pipe.xadd(stream, {FIELD: encode(env)})
            return [_s(i) for i in pipe.execute()]

    def commit(self, tag: str, epoch: int, outs: Sequence[Out], consumed: Consumed | None = None) -> CommitResult:
        """Append ``outs`` and acknowledge ``consumed`` atomically, if ``epoch`` is not stale.

        A consumed entry that is no longer pending (another consumer, or an earlier try,
        committed it) makes the commit a no-op: ``CommitResult(duplicate=True)``. Several
        entries of one inbox can be acknowledged by one commit (group commit).
        Every stream touched must be in ``tag`` (a commit never spans two tags).
        """
        keys = [self.keys.fence(tag), consumed.stream if consumed else self.keys.fence(tag)]
        index: dict[str, int] = {}
        ids = consumed.ids if consumed else ()
        args: list[object] = [epoch, consumed.group if consumed else "", len(ids), *ids]
        encoded: dict[int, bytes] = {}  # an event written to two streams is encoded once
        for out in outs:
            pos = index.get(out.stream)
            if pos is None:
                _same_tag(tag, out.stream)
                keys.append(out.stream)
                pos = index[out.stream] = len(keys)
            data = encoded.get(id(out.envelope))
            if data is None:
                data = encoded[id(out.envelope)] = encode(out.envelope)
            args += (pos, data, out.to or "")
        if consumed is not None:
            _same_tag(tag, consumed.stream)
        try:
            reply = self._commit(keys=keys, args=args)
        except redis.ResponseError as exc:
            raise _script_error(exc, tag, epoch) from exc
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise RedisUnavailable(f"Redis went away while committing to {tag}: {exc}") from exc
        if reply[0] == b"DUP":
            return CommitResult(duplicate=True)
        return CommitResult(duplicate=False, ids=tuple(_s(i) for i in reply[1:]))

    def fence(self, tag: str, epoch: int) -> int:
        """Claim ``tag`` for a leader at ``epoch``: later commits with older epochs are refused."""
        try:
            with translate_errors(f"fencing {tag}"):
                return int(self._fence(keys=[self.keys.fence(tag)], args=[epoch]))
        except redis.ResponseError as exc:
            raise _script_error(exc, tag, epoch) from exc

    # --- reading -------------------------------------------------------------------------

    def replay(self, stream: str, after: str = "0-0", *, page: int = 1000) -> Iterator[tuple[str, Envelope]]:
        """Every event of ``stream`` after entry ``after``, decoded, in order, read in pages.

        Undecodable entries raise DecodeError naming the stream and entry: a fact stream
        is written only through commits, so one is a corrupted log, not bad input.
        """
        for raw_id, fields in self._pages(stream, after, page):
            if len(fields) == 2 and fields[0] == FIELD:  # the one shape commits write
                try:
                    env = decode_bytes(fields[1])
                except DecodeError as exc:
                    raise exc.at(stream, raw_id.decode()) from None
                yield raw_id.decode(), env
            else:
                entry_id = raw_id.decode()
                yield entry_id, decode_fields(_pairs(fields), stream=stream, entry_id=entry_id)

    def replay_raw(self, stream: str, after: str = "0-0", *, page: int = 1000) -> Iterator[tuple[str, dict[bytes, bytes]]]:
        """Like replay, but the entries' fields undecoded (for inspection and dead letters)."""
        for raw_id, fields in self._pages(stream, after, page):
            yield raw_id.decode(), _pairs(fields)

    def _pages(self, stream: str, after: str, page: int) -> Iterator[tuple[bytes, list[bytes]]]:
        """XRANGE pages as Redis sends them (id, [field, value, ...]): replay reads millions of
        entries, and skipping redis-py's per-entry dict building is a third of its cost."""
        start = "(" + after if after not in ("0", "0-0", "-") else "-"
        pool = self.client.connection_pool
        while True:
            with translate_errors(f"reading {stream}"):
                conn = pool.get_connection()
                try:
                    conn.send_command("XRANGE", stream, start, "+", "COUNT", page)
                    batch = conn.read_response()
                except BaseException:
                    conn.disconnect()
                    raise
                finally:
                    pool.release(conn)
            yield from batch
            if len(batch) < page:
                return
            start = "(" + batch[-1][0].decode()

    def last_id(self, stream: str) -> str | None:
        with translate_errors(f"reading {stream}"):
            last = self.client.xrevrange(stream, "+", "-", count=1)
        return _s(last[0][0]) if last else None

    def length(self, stream: str) -> int:
        with translate_errors(f"reading {stream}"):
            return int(self.client.xlen(stream))

    def follow(self, positions: dict[str, str], *, block_ms: int | None = 1000, count: int = 1000) -> list[tuple[str, str, dict[bytes, bytes]]]:
        """Entries after the given positions of several streams (blocking up to ``block_ms``).

        Returns (stream, entry id, fields) in per-stream order; the caller advances
        ``positions`` itself (so it can record them atomically with what it derived).
        """
        if not positions:
            return []
        with translate_errors("following " + ", ".join(positions)):
            reply = self.client.xread(positions, count=count, block=block_ms)
        out: list[tuple[str, str, dict[bytes, bytes]]] = []
        for stream, entries in reply or ():
            name = _s(stream)
            for raw_id, fields in entries:
                out.append((name, _s(raw_id), fields))
        return out

    def trim_consumed(self, stream: str, group: str, *, keep_ms: int, now_ms: int) -> int:
        """Drop entries of an inbox that ``group`` has processed and that are older than
        ``keep_ms`` (kept that long for inspection); never an unread or pending entry."""
        with translate_errors(f"trimming {stream}"):
            try:
                groups = self.client.xinfo_groups(stream)
            except redis.ResponseError:
                return 0  # no such stream yet
            mine = [g for g in groups if _s(g["name"]) == group]
            if not mine:
                return 0
            cutoff = (max(now_ms - keep_ms, 0), 0)
            last = mine[0]["last-delivered-id"]
            cutoff = min(cutoff, entry_order(_s(last)))
            pending = self.client.xpending(stream, group)
            if pending and pending.get("pending"):
                cutoff = min(cutoff, entry_order(_s(pending["min"])))
            if cutoff <= (0, 0):
                return 0
            return int(self.client.xtrim(stream, minid=f"{cutoff[0]}-{cutoff[1]}", approximate=False))

    def streams(self) -> list[str]:
        """Every stream under this prefix (inboxes, facts, outboxes, dead letters), sorted."""
        found = []
        with translate_errors("listing streams"):
            for key in self.client.scan_iter(match=self.keys.pattern, count=1000, _type="stream"):
                name = _s(key)
                if self.keys.is_stream_name(name):
                    found.append(name)
        return sorted(found)


def _same_tag(tag: str, stream: str) -> None:
    if tag_of(stream) != tag:
        raise StoreError(
            f"a commit to {tag} cannot write {stream}: one commit stays inside one hash tag; "
            "send it through the outbox instead"
        )


def _script_error(exc: redis.ResponseError, tag: str, epoch: int) -> StoreError:
    text = str(exc)
    if scripts.STALE in text:
        current = int(text.rsplit(" ", 1)[-1])
        return StaleEpoch(tag=tag, epoch=epoch, current=current)
    return ScriptError(f"script on {tag} failed: {text}")


def _pairs(flat: list[bytes]) -> dict[bytes, bytes]:
    return dict(zip(flat[::2], flat[1::2]))


def entry_order(entry_id: str) -> tuple[int, int]:
    """A stream entry id as a sortable (milliseconds, sequence) pair."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
