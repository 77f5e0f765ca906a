"""The event log: appends, atomic fenced commits, paged replay and following of streams.

Every method may raise :class:`~sluice.errors.RedisUnavailable` (the server cannot be
reached); a refused epoch raises :class:`~sluice.errors.StaleEpoch`, a server that
restarted since the writer last looked raises :class:`~sluice.errors.StoreRestarted`.
The log talks to its server through a :class:`~sluice.store.backend.Backend`: a real
Redis, or the in-memory store of the simulation.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sluice.errors import (
    DecodeError,
    PartlyAppended,
    RedisUnavailable,
    ScriptError,
    StaleEpoch,
    StoreError,
    StoreRestarted,
    WrongType,
)
from sluice.events import FIELD, Envelope, decode_bytes, decode_fields, encode
from sluice.events.fastdecode import decode_bytes_msgspec

from . import scripts
from .backend import Backend, ScriptFailed
from .keys import Keys, tag_of
from .redis_backend import RedisBackend, translate_errors
from .replay_reader import read_ahead
from .wait import Wait, script_then_wait

__all__ = [
    "EventLog",
    "Out",
    "Consumed",
    "CommitResult",
    "translate_errors",
    "entry_order",
    "script_error",
    "committed_events",
    "trim_point",
    "successor",
]


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
    """The entry id of each of the commit's ``outs``, in order."""
    addressed: tuple[tuple[str, str, bytes], ...] = ()
    """(entry id, target, encoded message) of each out with a target, in order: what the
    commit put in an outbox, for its delivery without reading it back."""
    outbox: str = ""
    """The stream the first addressed out went to ('' when no out had a target) ..."""
    before: str = ""
    """... and that stream's last entry id just before the commit ('' when it was empty)."""


def committed_events(args: Sequence[Any]) -> list[tuple[int, Any, Any]]:
    """The events of a commit script's arguments (as ``EventLog.commit`` lays them out), each
    as (index into its keys, encoded envelope, outbox target or ''): for observers of the
    calls (the simulation's checks)."""
    n = int(args[3])
    return [(int(args[i]), args[i + 1], args[i + 2]) for i in range(6 + n, len(args), 3)]


class EventLog:
    """Sluice's view of the streams. One per process; cheap to share between threads
    (redis-py's pool hands each call its own connection). Built on a redis-py client or
    on any :class:`Backend`."""

    def __init__(
        self,
        backend: Backend | Any,
        keys: Keys | None = None,
        *,
        decode: Callable[[bytes], Envelope] = decode_bytes_msgspec,
    ) -> None:
        self.backend: Backend = backend if isinstance(backend, Backend) else RedisBackend(backend)
        self.keys = keys or Keys()
        self.decode = decode
        """How ``replay`` decodes an entry's envelope (``events.fastdecode.decode_bytes_msgspec``:
        this Sluice's schema versions, as ``events.decode_bytes`` reads them, faster). A test or the simulation gives a JobManager of another version its
        own (tools/sim/skew.py)."""
        self.wait = Wait()
        """Replicas a commit must reach before it is acknowledged (store/wait.py; none by default:
        ``SLUICE_REDIS_WAIT_REPLICAS``)."""
        self.read_ahead = True
        """Whether ``replay`` reads a real Redis's next pages on a thread while the caller
        folds (off: each page read when asked, as before; the recovery bench's reference)."""
        self.on_set_aside: Callable[[str, str, str], None] | None = None
        """Told (inbox, the kind of value found there, where it went) of each inbox this
        process moved aside (``set_aside``): the process's log line."""

    # --- inboxes that are not streams ----------------------------------------------------

    def set_aside(self, streams: Sequence[str], group: str = "") -> list[str]:
        """Move aside what is not a stream among the inboxes ``streams`` (something other
        than Sluice wrote their keys: Redis answers WRONGTYPE) to ``Keys.set_aside``, kept
        as it was, in one round trip; each is made again with ``group`` at '0', or, with
        none (a writer), left to the next append (its reader makes its group at '0' when it
        finds none, and reads what was appended). Returns the inboxes moved."""
        stamp = f"{self.backend.time_ms()}-{os.urandom(3).hex()}"
        calls = [("set_aside", [s, Keys.set_aside(s, stamp)], [group]) for s in streams]
        moved = []
        for (_, (stream, aside), _), kind in zip(calls, self.backend.script_many(calls)):
            if isinstance(kind, Exception):
                raise kind
            if kind:
                moved.append(stream)
                if self.on_set_aside is not None:
                    self.on_set_aside(stream, kind.decode() if isinstance(kind, bytes) else str(kind), aside)
        return moved

    @property
    def client(self) -> Any:
        """The redis-py client under a Redis backend (for tests and tools; services go
        through the log and never touch it)."""
        backend = self.backend
        if isinstance(backend, RedisBackend):
            return backend.client
        raise AttributeError(f"a {type(backend).__name__} has no redis-py client")

    # --- writing -------------------------------------------------------------------------

    def append(self, stream: str, env: Envelope, *, maxlen: int | None = None) -> str:
        """Append one message to a stream (an inbox), unfenced: for senders that are not
        leaders. An inbox that holds another kind of value is moved aside first (WrongType
        when it cannot be: it is not an inbox, or it was written again at once)."""
        fields = {FIELD: encode(env)}
        try:
            return self.backend.xadd(stream, fields, maxlen=maxlen)
        except WrongType:
            if not self.keys.is_inbox(stream):
                raise
            self.set_aside([stream])  # (or its reader did, meanwhile: either way, again)
            return self.backend.xadd(stream, fields, maxlen=maxlen)

    def append_raw(self, stream: str, fields: dict[bytes, bytes]) -> str:
        """Append an entry as given, not an envelope (tools, tests and the simulation use it
        to write what Sluice never would: a malformed entry)."""
        return self.backend.xadd(stream, fields)

    def append_batch(self, stream: str, envs: Sequence[Envelope]) -> list[str]:
        """Append several messages in one round trip, in order."""
        return self.backend.xadd_many([(stream, {FIELD: encode(env)}) for env in envs])

    def append_each(self, items: Sequence[tuple[str, Envelope]]) -> list[str]:
        """Append one message to each of several streams in one round trip (e.g. the
        leader's heartbeat to every TaskManager); an envelope sent twice is encoded once."""
        encoded: dict[int, bytes] = {}
        batch = []
        for stream, env in items:
            data = encoded.get(id(env))
            if data is None:
                data = encoded[id(env)] = encode(env)
            batch.append((stream, {FIELD: data}))
        try:
            return self.backend.xadd_many(batch)
        except PartlyAppended as exc:
            # Inboxes that hold another kind of value: moved aside, and what they refused
            # appended again, in order (the rest went).
            refused = sorted(exc.errors)
            inboxes = list(dict.fromkeys(batch[i][0] for i in refused if self.keys.is_inbox(batch[i][0])))
            if not inboxes:
                raise
            try:
                self.set_aside(inboxes)  # (or their readers did, meanwhile: either way, again)
            except RedisUnavailable:
                raise
            except StoreError:
                raise exc from None
            ids = list(exc.ids)
            try:
                again = self.backend.xadd_many([batch[i] for i in refused])
            except PartlyAppended as second:
                for i, entry in zip(refused, second.ids):
                    ids[i] = entry
                raise PartlyAppended(ids, {refused[j]: e for j, e in second.errors.items()}) from None
            for i, entry in zip(refused, again):
                ids[i] = entry
            return [i for i in ids if i is not None]

    def server_id(self) -> str:
        """The server's run id: it changes when the server restarts (see StoreRestarted)."""
        return self.backend.server_id()

    def commit(
        self,
        tag: str,
        epoch: int,
        outs: Sequence[Out],
        consumed: Consumed | None = None,
        *,
        server: str = "",
        advance: str | None = None,
    ) -> CommitResult:
        """Append ``outs`` and acknowledge ``consumed`` atomically, if ``epoch`` is not stale
        and (given ``server``, a run id) the server has not restarted since.

        A consumed entry that is no longer pending (another consumer, or an earlier try,
        committed it) makes the commit a no-op: ``CommitResult(duplicate=True)``. Several
        entries of one inbox can be acknowledged by one commit (group commit).
        Every stream touched must be in ``tag`` (a commit never spans two tags).
        ``advance``: an outbox entry of the tag delivered with all before it; its cursor is
        moved there (never back) with the commit (``Deliverer``: one round trip less).
        """
        keys = [self.keys.fence(tag), consumed.stream if consumed else self.keys.fence(tag)]
        index: dict[str, int] = {}
        ids = consumed.ids if consumed else ()
        args: list[object] = [epoch, server, consumed.group if consumed else "", len(ids), *ids]
        if advance is None:
            args += (0, "")
        else:
            keys.append(self.keys.outbox_cursor(tag))
            args += (len(keys), advance)
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
            reply = self._commit_script(keys, args)
        except ScriptFailed as exc:
            if self._clobbered_inbox(exc, keys) is None:
                raise script_error(exc, tag, epoch) from exc
            # An inbox it writes to (a subtask's) holds another kind of value: nothing was
            # written; the value is moved aside and the commit goes again (it failed every
            # time, and the leader rebuilt and decided it again, for ever). Every inbox it
            # writes to is looked at (the script names only the first bad one).
            self.set_aside([k for k in dict.fromkeys(keys[2:]) if self.keys.is_inbox(k)])
            try:
                reply = self._commit_script(keys, args)
            except ScriptFailed as again:
                raise script_error(again, tag, epoch) from again
        if _s(reply[0]) == "DUP":
            return CommitResult(duplicate=True)
        ids = tuple(_s(i) for i in reply[1 : 1 + len(outs)])
        addressed = tuple((i, out.to, encoded[id(out.envelope)]) for i, out in zip(ids, outs) if out.to)
        if not addressed:
            return CommitResult(duplicate=False, ids=ids)
        outbox = next(out.stream for out in outs if out.to)
        return CommitResult(False, ids, addressed, outbox, _s(reply[1 + len(outs)]))

    def _commit_script(self, keys: list[str], args: list[object]) -> Any:
        """The commit script, followed by WAIT on its connection when ``wait`` asks for replicas."""
        if self.wait.on:
            return script_then_wait(self.backend, "commit", keys, args, self.wait)
        return self.backend.script("commit", keys, args)

    def _clobbered_inbox(self, exc: ScriptFailed, keys: list[str]) -> str | None:
        """The inbox a commit refused to write to because it is not a stream, if that is why."""
        text = exc.text
        if not text.startswith(scripts.NOT_A_STREAM + " "):
            return None
        key = next((k for k in keys[2:] if text.startswith(f"{scripts.NOT_A_STREAM} {k} is a ")), None)
        return key if key is not None and self.keys.is_inbox(key) else None

    def fence(self, tag: str, epoch: int, *, server: str = "") -> int:
        """Claim ``tag`` for a leader at ``epoch``: later commits with older epochs are refused."""
        try:
            return int(self.backend.script("fence", [self.keys.fence(tag)], [epoch, server]))
        except ScriptFailed as exc:
            raise script_error(exc, tag, epoch) from exc

    # --- reading -------------------------------------------------------------------------

    def replay(self, stream: str, after: str = "0-0", *, page: int = 1000) -> Iterator[tuple[str, Envelope]]:
        """Every event of ``stream`` after entry ``after``, decoded, in order, read in pages.

        Undecodable entries raise DecodeError naming the stream and entry (after the
        entries before it): a fact stream is written only through commits, so one is a
        corrupted log, not bad input.
        """
        for batch in self._batches_ahead(stream, after, page):
            envs = _decode_fast(batch, self.decode)
            yield from envs if envs is not None else _decode_each(stream, batch, self.decode)

    def replay_pages(
        self, stream: str, after: str = "0-0", *, page: int = 1000
    ) -> Iterator[list[tuple[str, Envelope]]]:
        """``replay`` a page at a time: each page's (entry id, envelope) pairs, decoded in one
        tight loop (a JobManager's replay decodes millions; a generator step per entry cost
        a tenth of it). An undecodable entry raises DecodeError before its page is given."""
        for batch in self._batches_ahead(stream, after, page):
            envs = _decode_fast(batch, self.decode)
            yield envs if envs is not None else list(_decode_each(stream, batch, self.decode))

    def replay_raw(
        self, stream: str, after: str = "0-0", *, page: int = 1000
    ) -> Iterator[tuple[str, dict[bytes, bytes]]]:
        """Like replay, but the entries' fields undecoded (for inspection and dead letters)."""
        yield from self._pages(stream, after, page)

    def entry(self, stream: str, entry_id: str) -> dict[bytes, bytes] | None:
        """The fields of entry ``entry_id`` of ``stream`` (None when it is not there)."""
        ms, seq = entry_order(entry_id)
        before = f"{ms}-{seq - 1}" if seq else (f"{ms - 1}-18446744073709551615" if ms else None)
        batch = self.backend.xrange(stream, before, 1)
        return batch[0][1] if batch and batch[0][0] == entry_id else None

    def read_page(self, stream: str, after: str = "0-0", *, count: int = 1000) -> list[tuple[str, dict[bytes, bytes]]]:
        """One page of raw entries after ``after`` (a caller that pages at its own pace)."""
        return self.backend.xrange(stream, after, count)

    def _pages(self, stream: str, after: str, page: int) -> Iterator[tuple[str, dict[bytes, bytes]]]:
        for batch in self._batches(stream, after, page):
            yield from batch

    def _batches_ahead(self, stream: str, after: str, page: int) -> Iterator[list[tuple[str, dict[bytes, bytes]]]]:
        """``_batches``, the next pages read by a thread while the caller decodes and folds
        (store/replay_reader.py) on a real Redis; read in the caller on any other backend
        (the simulation's stays deterministic)."""
        if self.read_ahead and isinstance(self.backend, RedisBackend):
            return read_ahead(self.backend.xrange, stream, after, page)
        return self._batches(stream, after, page)

    def _batches(self, stream: str, after: str, page: int) -> Iterator[list[tuple[str, dict[bytes, bytes]]]]:
        """The stream's raw entries after ``after``, one XRANGE of up to ``page`` at a time."""
        start: str | None = after
        while True:
            batch = self.backend.xrange(stream, start, page)
            if batch:
                yield batch
            if len(batch) < page:
                return
            start = batch[-1][0]

    def last_id(self, stream: str) -> str | None:
        return self.backend.last_id(stream)

    def length(self, stream: str) -> int:
        return self.backend.xlen(stream)

    def follow(
        self, positions: dict[str, str], *, block_ms: int | None = 1000, count: int = 1000
    ) -> list[tuple[str, str, dict[bytes, bytes]]]:
        """Entries after the given positions of several streams (blocking up to ``block_ms``).

        Returns (stream, entry id, fields) in per-stream order; the caller advances
        ``positions`` itself (so it can record them atomically with what it derived).
        """
        return self.backend.xread(positions, count=count, block_ms=block_ms)

    def trim_consumed(self, stream: str, group: str, *, keep_ms: int, now_ms: int) -> int:
        """Drop entries of an inbox that ``group`` has processed and that are older than
        ``keep_ms`` (kept that long for inspection); never an unread or pending entry.

        Safe against a concurrent append (its id is above every id read here), delivery
        (it delivers only entries after the last delivered one, which stays) and
        acknowledgement (it only shrinks the pending list): the group is read first, then
        the stream is trimmed below the least of those bounds."""
        state = self.backend.group_state(stream, group)
        if state is None:
            return 0  # no such stream or group yet
        cutoff = trim_point(now_ms, keep_ms, state.last_delivered, state.min_pending)
        return self._trim(stream, cutoff)

    def trim_delivered(self, tag: str, *, keep_ms: int, now_ms: int) -> int:
        """Drop entries of the tag's outbox up to its delivery cursor that are older than
        ``keep_ms``; never one after the cursor (recovery delivers again from there). The
        cursor only moves forward, and an append comes after it: trimming below a cursor
        read earlier is safe whatever delivery or commit runs meanwhile. The cursor's own
        entry stays (a commit reads the outbox's last id to deliver without reading back)."""
        cursor = self.backend.get(self.keys.outbox_cursor(tag))
        if cursor is None:
            return 0  # nothing delivered yet (or no outbox)
        cutoff = trim_point(now_ms, keep_ms, cursor.decode())
        return self._trim(self.keys.outbox(tag), cutoff)

    def trim_read(self, stream: str, last_read: str, *, keep_ms: int, now_ms: int) -> int:
        """Drop entries of ``stream`` up to and including ``last_read`` (its reader is done
        with them: a subtask inbox whose attempt ended) that are older than ``keep_ms``.
        Anything appended after ``last_read`` was read stays."""
        cutoff = trim_point(now_ms, keep_ms, successor(last_read))
        return self._trim(stream, cutoff)

    def _trim(self, stream: str, cutoff: str | None) -> int:
        if cutoff is None:
            return 0
        try:
            return self.backend.xtrim_minid(stream, cutoff)
        except WrongType:  # overwritten since the look: its reader moves it aside and makes it again
            return 0

    def trim_before(self, stream: str, entry_id: str) -> int:
        """Drop the entries of ``stream`` before ``entry_id`` (e.g. a delivered outbox's past)."""
        return self.backend.xtrim_minid(stream, entry_id)

    def streams(self) -> list[str]:
        """Every stream under this prefix (inboxes, facts, outboxes, dead letters), sorted."""
        return sorted(name for name in self.backend.scan_streams(self.keys.pattern) if self.keys.is_stream_name(name))


def _decode_fast(
    batch: list[tuple[str, Any]], decode: Callable[[bytes], Envelope] = decode_bytes
) -> list[tuple[str, Envelope]] | None:
    """A page of entries of the shape commits write (field ``e``) decoded; None when one is
    not (or does not decode): ``_decode_each`` then finds which and says why, after the
    entries before it."""
    try:
        return [(entry_id, decode(fields[FIELD])) for entry_id, fields in batch]
    except Exception:  # decoded again, one by one: the error is raised there
        return None


def _decode_each(
    stream: str, batch: list[tuple[str, Any]], decode: Callable[[bytes], Envelope] = decode_bytes
) -> Iterator[tuple[str, Envelope]]:
    for entry_id, fields in batch:
        raw = fields.get(FIELD) if isinstance(fields, dict) else None
        if raw is not None and len(fields) == 1:  # the one shape commits write
            try:
                env = decode(raw)
            except DecodeError as exc:
                raise exc.at(stream, entry_id) from None
            yield entry_id, env
        else:
            yield entry_id, decode_fields(fields, stream=stream, entry_id=entry_id)


def _same_tag(tag: str, stream: str) -> None:
    if tag_of(stream) != tag:
        raise StoreError(
            f"a commit to {tag} cannot write {stream}: one commit stays inside one hash tag; "
            "send it through the outbox instead"
        )


def script_error(exc: ScriptFailed, tag: str, epoch: int | None = None) -> StoreError:
    """The error a script's error reply means, naming the tag (and the writer's epoch)."""
    text = exc.text
    if scripts.STALE in text:
        current = int(text.rsplit(" ", 1)[-1])
        return StaleEpoch(tag=tag, epoch=epoch if epoch is not None else -1, current=current)
    if scripts.RESTARTED in text:
        return StoreRestarted(tag=tag, run_id=text.rsplit(" ", 1)[-1])
    return ScriptError(f"script on {tag} failed: {text}")


def trim_point(now_ms: int, keep_ms: int, *bounds: str | None) -> str | None:
    """Where a stream may be trimmed (XTRIM MINID: entries below it go): below every bound
    given (an entry id that must stay, e.g. a group's oldest pending entry; None: no bound)
    and below ``now_ms - keep_ms`` (newer entries are kept for inspection); None when
    nothing may go."""
    cutoff = (max(now_ms - keep_ms, 0), 0)
    for bound in bounds:
        if bound is not None:
            cutoff = min(cutoff, entry_order(bound))
    return None if cutoff <= (0, 0) else f"{cutoff[0]}-{cutoff[1]}"


def successor(entry_id: str) -> str:
    """The least entry id after ``entry_id``."""
    ms, seq = entry_order(entry_id)
    return f"{ms}-{seq + 1}"


def entry_order(entry_id: str) -> tuple[int, int]:
    """A stream entry id as a sortable (milliseconds, sequence) pair."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
