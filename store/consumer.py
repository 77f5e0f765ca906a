"""Reading an inbox through a consumer group: new entries, own pending ones after a
restart, entries reclaimed from a dead consumer, and dead-lettering of bad entries.

Entries that cannot be decoded never reach the caller: they are moved, with the
reason, to the tag's dead-letter stream and acknowledged in one step, and the
``on_dead_letter`` callback (e.g. a log line) is told.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import redis

from sluice.errors import DecodeError
from sluice.events import Envelope, decode_fields

from . import scripts
from .keys import tag_of
from .log import EventLog, _s, translate_errors

__all__ = ["GroupConsumer", "Entry", "ensure_group"]


@dataclass(frozen=True, slots=True)
class Entry:
    stream: str
    id: str
    envelope: Envelope


DeadLetterHook = Callable[[str, str, DecodeError], None]


def ensure_group(log: EventLog, stream: str, group: str, start: str = "0") -> None:
    """Create consumer group ``group`` on ``stream`` (and the stream) unless it exists."""
    with translate_errors(f"creating group {group} on {stream}"):
        try:
            log.client.xgroup_create(stream, group, id=start, mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise


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
    ) -> None:
        self.log, self.group, self.consumer = log, group, consumer
        self.streams: list[str] = [stream] if isinstance(stream, str) else list(stream)
        self._dead = log.client.register_script(scripts.DEAD_LETTER)
        self._on_dead = on_dead_letter
        self._ensured: set[str] = set()

    @property
    def stream(self) -> str:
        return self.streams[0]

    def add_stream(self, stream: str, start: str = "0") -> None:
        if stream not in self.streams:
            self.streams.append(stream)
        self._ensure(stream, start)

    def remove_stream(self, stream: str) -> None:
        if stream in self.streams:
            self.streams.remove(stream)

    def ensure_group(self, start: str = "0") -> None:
        """Create the group (and the streams) if missing; ``start`` '0' reads from the beginning."""
        for s in self.streams:
            self._ensure(s, start)

    def _ensure(self, stream: str, start: str) -> None:
        ensure_group(self.log, stream, self.group, start)
        self._ensured.add(stream)

    def read(self, *, count: int = 100, block_ms: int | None = 100) -> list[Entry]:
        """New entries for this consumer (blocking up to ``block_ms``; None means don't block)."""
        return self._read(">", count, block_ms)

    def pending(self, *, count: int = 100) -> list[Entry]:
        """Entries delivered to this consumer earlier but not acknowledged (e.g. before a crash)."""
        return self._read("0", count, None)

    def reclaim(self, *, min_idle_ms: int, count: int = 100) -> list[Entry]:
        """Take over entries another consumer left pending for at least ``min_idle_ms``."""
        out: list[Entry] = []
        for stream in self.streams:
            if stream not in self._ensured:
                self._ensure(stream, "0")
            start = "0-0"
            while True:
                with translate_errors(f"reclaiming from {stream}"):
                    reply = self.log.client.xautoclaim(
                        stream, self.group, self.consumer, min_idle_time=min_idle_ms, start_id=start, count=count
                    )
                nxt, claimed = reply[0], reply[1]
                out += self._decode_all(stream, claimed)
                start = _s(nxt)
                if start == "0-0":
                    break
        return out

    def ack(self, *entry_ids: str, stream: str | None = None) -> int:
        stream = stream or self.stream
        with translate_errors(f"acknowledging on {stream}"):
            return int(self.log.client.xack(stream, self.group, *entry_ids))

    def _read(self, start: str, count: int, block_ms: int | None) -> list[Entry]:
        for s in self.streams:
            if s not in self._ensured:
                self._ensure(s, "0")
        if not self.streams:
            return []
        with translate_errors("reading " + ", ".join(self.streams)):
            try:
                reply = self.log.client.xreadgroup(
                    self.group, self.consumer, {s: start for s in self.streams}, count=count, block=block_ms
                )
            except redis.ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                self._ensured.clear()  # a stream was deleted under us; create the groups again
                return []
        out: list[Entry] = []
        for stream, entries in reply or ():
            out += self._decode_all(_s(stream), entries)
        return out

    def _decode_all(self, stream: str, entries: list) -> list[Entry]:
        out = []
        for raw_id, fields in entries:
            entry_id = _s(raw_id)
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

    def dead_letter(self, entry_id: str, fields: dict, error: DecodeError, *, stream: str | None = None) -> None:
        """Park an entry (with why) in its tag's dead-letter stream and acknowledge it."""
        stream = stream or self.stream
        args: list[object] = [self.group, entry_id, error.kind, error.reason]
        for k, v in fields.items():
            args += (k, v)
        with translate_errors(f"dead-lettering {stream} {entry_id}"):
            self._dead(keys=[stream, self.log.keys.dead(tag_of(stream))], args=args)
        if self._on_dead is not None:
            self._on_dead(stream, entry_id, error)
