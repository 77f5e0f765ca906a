"""Reading an inbox through a consumer group: new entries, own pending ones after a
restart, entries reclaimed from a dead consumer, and dead-lettering of bad entries.

Entries that cannot be decoded never reach the caller: they are moved, with the
reason, to the tag's dead-letter stream and acknowledged in one step, and the
``on_dead_letter`` callback (e.g. a log line) is told.

An inbox whose key holds another kind of value (something else wrote it: Redis answers
WRONGTYPE, and one such key fails a read of every stream with it) is moved aside, kept
under ``Keys.set_aside`` for a person to look at, and made again with the group, in one
script (``EventLog.set_aside``: its ``on_set_aside`` is told), and the read goes on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sluice.errors import DecodeError, PartlyRead, RedisUnavailable, StoreError, WrongType
from sluice.events import Envelope, decode_fields

from .backend import Fields, NoGroup, ScriptFailed
from .keys import tag_of
from .log import EventLog, entry_order

__all__ = ["GroupConsumer", "Entry", "ensure_group", "dead_letter", "MAX_REASON"]

MAX_REASON = 2000
"""Longest reason kept with a dead letter (a reason is for a person, not a traceback dump)."""


@dataclass(frozen=True, slots=True)
class Entry:
    stream: str
    id: str
    envelope: Envelope


DeadLetterHook = Callable[[str, str, DecodeError], None]


def ensure_group(log: EventLog, stream: str, group: str, start: str = "0") -> None:
    """Create consumer group ``group`` on ``stream`` (and the stream) unless it exists."""
    log.backend.group_create(stream, group, start)


def dead_letter(log: EventLog, stream: str, group: str, entry_id: str, fields: Fields, kind: str, reason: str) -> None:
    """Park an entry (with why) in its tag's dead-letter stream and, read through
    ``group`` (not ''), acknowledge it, in one step."""
    if len(reason) > MAX_REASON:
        reason = reason[: MAX_REASON - 20] + " … (cut)"
    args: list[object] = [group, entry_id, kind, reason]
    for k, v in fields.items():
        args += (k, v)
    log.backend.script("dead_letter", [stream, log.keys.dead(tag_of(stream))], args)


class GroupConsumer:
    """A consumer in group ``group`` over one or more streams (the JobManager reads the
    cluster inbox and every running job's inbox in one blocking call)."""

    def __init__(
        self,
        log: EventLog,
        stream: str | list[str],
        group: str,
        consumer: str,
        *,
        on_dead_letter: DeadLetterHook | None = None,
        sole: bool = False,
    ) -> None:
        self.log, self.group, self.consumer = log, group, consumer
        self.sole = sole
        """This consumer is the group's only rightful reader (the leader): entries another
        consumer holds pending (a deposed leader read them) are taken over at each ``read``
        and decided in stream order with what it returned (``xreadgroup_sole``)."""
        self.taken_over = 0
        """How many entries the last ``read`` took over from other consumers."""
        self._fresh: set[str] = set()
        """Streams a sole reader began to read since its last ``read``: what is pending there
        (read by an earlier life of any consumer) is decided first, at that read."""
        self.streams: list[str] = [stream] if isinstance(stream, str) else list(stream)
        self._on_dead = on_dead_letter
        self._ensured: set[str] = set()
        self.read_counts: dict[str, int] = {}
        """How many entries the last read took from each stream (dead-lettered ones too):
        fewer than asked for means that stream was read to its end."""
        self._later: dict[str, list[str]] = {}
        """Entries to acknowledge with the next read (``ack_later``), by stream."""

    @property
    def stream(self) -> str:
        return self.streams[0]

    def add_stream(self, stream: str, start: str = "0") -> None:
        if stream not in self.streams:
            self.streams.append(stream)
            if self.sole:
                self._fresh.add(stream)
        self._ensure(stream, start)

    def remove_stream(self, stream: str) -> None:
        if stream in self.streams:
            self.streams.remove(stream)
        self._ensured.discard(stream)  # (a stream read again is ensured again: its group may be gone)

    def ensure_group(self, start: str = "0") -> None:
        """Create the group (and the streams) if missing; ``start`` '0' reads from the beginning."""
        for s in self.streams:
            self._ensure(s, start)

    def _ensure(self, stream: str, start: str) -> None:
        try:
            ensure_group(self.log, stream, self.group, start)
        except WrongType:
            self.set_aside([stream])  # made again, with the group
        self._ensured.add(stream)

    def set_aside(self, streams: list[str]) -> list[str]:
        """Move aside what is not a stream among ``streams`` and make each such inbox again,
        empty, with this group (``EventLog.set_aside``); the ones moved."""
        return self.log.set_aside(streams, self.group)

    def read(self, *, count: int = 100, block_ms: int | None = 100) -> list[Entry]:
        """New entries for this consumer (blocking up to ``block_ms``; None means don't block);
        ``read_counts`` says how many each stream gave."""
        counts: dict[str, int] = {}
        others: dict[str, int] = {}
        out = self._read_from(
            {s: ">" for s in self.streams},
            count,
            block_ms,
            counts,
            with_acks=True,
            others=others if self.sole else None,
        )
        self.read_counts = counts
        self.taken_over = 0
        if others:
            out = self._take_over(out, list(others))
        if self._fresh:  # pending there since an earlier life (of this consumer too): before what follows
            fresh = [s for s in self.streams if s in self._fresh]
            self._fresh.clear()
            out = self._with(out, self.recover(streams=fresh))
        return out

    def _take_over(self, read: list[Entry], streams: list[str]) -> list[Entry]:
        """``read`` with what other consumers hold pending on ``streams``, taken over: each
        entry once, in stream order within each stream (a deposed leader's entries come
        before the later ones this consumer read, or after them, where they were sent)."""
        return self._with(read, self.reclaim(min_idle_ms=0, streams=streams))

    def _with(self, read: list[Entry], more: list[Entry]) -> list[Entry]:
        """``read`` merged with ``more`` in stream order, ``taken_over`` counting what it added."""
        mine = {(e.stream, e.id) for e in read}
        added = [e for e in more if (e.stream, e.id) not in mine]
        if not added:
            return read
        self.taken_over += len(added)
        return self._in_order(read + added)

    def _in_order(self, entries: list[Entry]) -> list[Entry]:
        """Each entry once, by stream (in the order read) and in stream order within each."""
        seen: set[tuple[str, str]] = set()
        out: list[Entry] = []
        for entry in entries:
            key = (entry.stream, entry.id)
            if key not in seen:
                seen.add(key)
                out.append(entry)
        order = {s: i for i, s in enumerate(self.streams)}
        out.sort(key=lambda e: (order.get(e.stream, len(order)), entry_order(e.id)))
        return out

    def ack_later(self, *entry_ids: str, stream: str | None = None) -> None:
        """Acknowledge these entries with the next ``read``, in its round trip (or at
        ``flush_acks``): for a reader that can meet an entry again after a failure and
        knows it handled it (one round trip a batch less)."""
        if entry_ids:
            self._later.setdefault(stream or self.stream, []).extend(entry_ids)

    def flush_acks(self) -> None:
        """Send the acknowledgements ``ack_later`` keeps, now."""
        for stream, ids in list(self._later.items()):
            self.ack(*ids, stream=stream)
            del self._later[stream]

    def pending(self, *, count: int = 100) -> list[Entry]:
        """Entries delivered to this consumer earlier but not acknowledged (e.g. before a crash)."""
        return self._read("0", count, None)

    def reclaim(self, *, min_idle_ms: int, count: int = 100, streams: list[str] | None = None) -> list[Entry]:
        """Take over entries another consumer left pending for at least ``min_idle_ms`` (of
        ``streams``, or of every stream read)."""
        out: list[Entry] = []
        for stream in list(self.streams if streams is None else streams):
            if stream not in self._ensured:
                self._ensure(stream, "0")
            start = "0-0"
            while True:
                try:
                    nxt, claimed = self.log.backend.xautoclaim(
                        stream, self.group, self.consumer, min_idle_ms=min_idle_ms, start=start, count=count
                    )
                except NoGroup:
                    self._ensured.discard(stream)
                    break
                except WrongType:
                    self.set_aside([stream])  # made again, empty: nothing to reclaim
                    break
                out += self._decode_all(stream, claimed)
                start = nxt
                if start == "0-0":
                    break
        return out

    def recover(self, *, count: int = 1000, streams: list[str] | None = None) -> list[Entry]:
        """Every entry read before and not acknowledged, by any consumer of the group (a
        new leader takes over what the old one had read but not committed), each once, in
        stream order per stream; of ``streams`` (a stream it begins to read), or of all."""
        return self._in_order(
            self.reclaim(min_idle_ms=0, count=count, streams=streams) + self.pending_all(count=count, streams=streams)
        )

    def pending_all(self, *, count: int = 1000, streams: list[str] | None = None) -> list[Entry]:
        """Every entry pending for this consumer (all pages; of ``streams``, or of all)."""
        out: list[Entry] = []
        positions = {s: "0" for s in (self.streams if streams is None else streams)}
        while positions:
            batch = self._read_from(positions, count, None)
            if not batch:
                break
            out += batch
            last: dict[str, str] = {}
            for e in batch:
                last[e.stream] = e.id
            positions = {s: last[s] for s in positions if s in last}
        return out

    def ack(self, *entry_ids: str, stream: str | None = None) -> int:
        return self.log.backend.xack(stream or self.stream, self.group, entry_ids)

    def skip_to_end(self) -> None:
        """Deliver nothing written before now, and drop what this consumer had read but not
        acknowledged (messages to an earlier session are void)."""
        for s in self.streams:
            self._ensure(s, "$")
            try:
                self.log.backend.group_setid(s, self.group, "$")
            except NoGroup:  # deleted (or clobbered, set aside and made again) since: the group again, at its end
                self._ensure(s, "$")
            except WrongType:  # clobbered since: made again, empty (its end is its start)
                self.set_aside([s])
        while True:
            stale = self._read("0", 1000, None)
            if not stale:
                return
            for s in self.streams:
                ids = [e.id for e in stale if e.stream == s]
                if ids:
                    try:
                        self.ack(*ids, stream=s)
                    except WrongType:  # clobbered since: what was pending went with it
                        self.set_aside([s])

    def _read(self, start: str, count: int, block_ms: int | None) -> list[Entry]:
        return self._read_from({s: start for s in self.streams}, count, block_ms)

    def _read_from(
        self,
        positions: dict[str, str],
        count: int,
        block_ms: int | None,
        counts: dict[str, int] | None = None,
        with_acks: bool = False,
        others: dict[str, int] | None = None,
    ) -> list[Entry]:
        """``with_acks``: the acknowledgements ``ack_later`` keeps go in the same round trip
        (kept for the next try if it fails; acknowledgements the server refuses had nothing
        left to do). ``others``: read as the sole consumer, filled with what other consumers
        hold pending per stream (``xreadgroup_sole``)."""
        for s in positions:
            if s not in self._ensured:
                self._ensure(s, "0")
        if not positions:
            if with_acks:
                self.flush_acks()
            return []
        ack = self._later if with_acks and self._later else None
        reply: list[tuple[str, str, Fields | None]] = []
        taken: list[tuple[str, str, Fields | None]] = []
        """Entries a refused read on a Redis Cluster took all the same (PartlyRead)."""
        for attempt in range(3):
            try:
                wait, acks = None if attempt else block_ms, None if attempt else ack
                if others is None:
                    reply = self.log.backend.xreadgroup(
                        self.group, self.consumer, positions, count=count, block_ms=wait, ack=acks
                    )
                else:
                    reply, found = self.log.backend.xreadgroup_sole(
                        self.group, self.consumer, positions, count=count, block_ms=wait, ack=acks
                    )
                    others.update(found)
                break
            except (NoGroup, WrongType, PartlyRead) as exc:
                refused: StoreError = exc
                if isinstance(exc, PartlyRead):  # (a cluster: other slots' entries were taken)
                    taken += exc.entries
                    refused = exc.refused
                    if isinstance(refused, RedisUnavailable):
                        break  # what was taken now; the node that went away at the next read
                if isinstance(refused, NoGroup):  # a stream deleted under us (or made again by a writer)
                    self._ensured.clear()  # groups at '0', and again
                    if attempt < 2:
                        for s in positions:
                            self._ensure(s, "0")
                elif isinstance(refused, WrongType):  # (the acknowledgements went whatever the read answers)
                    if attempt == 2:
                        raise refused from exc
                    self.set_aside(list(positions))  # (or a writer did it meanwhile: then no group yet)
                else:
                    raise
        reply = taken + reply if taken else reply
        if ack:
            self._later = {}
        out: list[Entry] = []
        by_stream: dict[str, list[tuple[str, Fields | None]]] = {}
        for stream, entry_id, fields in reply:
            by_stream.setdefault(stream, []).append((entry_id, fields))
        if counts is not None:
            counts.update((s, len(e)) for s, e in by_stream.items())
        for stream, entries in by_stream.items():
            out += self._decode_all(stream, entries)
        return out

    def _decode_all(self, stream: str, entries: list[tuple[str, Fields | None]]) -> list[Entry]:
        out = []
        for entry_id, fields in entries:
            if fields is None:  # deleted from the stream while pending: nothing to process
                self.ack(entry_id, stream=stream)
                continue
            try:
                env = decode_fields(fields, stream=stream, entry_id=entry_id)
            except DecodeError as exc:
                self.dead_letter(entry_id, fields, exc, stream=stream)
                continue
            out.append(Entry(stream, entry_id, env))
        return out

    def dead_letter(self, entry_id: str, fields: Fields, error: DecodeError, *, stream: str | None = None) -> None:
        """Park an entry (with why) in its tag's dead-letter stream and acknowledge it. An
        inbox deleted or clobbered since it was read (the script's XPENDING answers NOGROUP
        or WRONGTYPE) has nothing left to acknowledge: the entry is parked all the same."""
        stream = stream or self.stream
        try:
            dead_letter(self.log, stream, self.group, entry_id, fields, error.kind, error.reason)
        except ScriptFailed as exc:
            if not exc.text.startswith(("NOGROUP", "WRONGTYPE")):
                raise
            if exc.text.startswith("WRONGTYPE"):
                self.set_aside([stream])  # made again, empty, with the group
            dead_letter(self.log, stream, "", entry_id, fields, error.kind, error.reason)
        if self._on_dead is not None:
            self._on_dead(stream, entry_id, error)
