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

__all__ = ["GroupConsumer", "Entry"]


@dataclass(frozen=True, slots=True)
class Entry:
    stream: str
    id: str
    envelope: Envelope


DeadLetterHook = Callable[[str, str, DecodeError], None]


class GroupConsumer:
    def __init__(
        self,
        log: EventLog,
        stream: str,
        group: str,
        consumer: str,
        *,
        on_dead_letter: DeadLetterHook | None = None,
    ) -> None:
        self.log, self.stream, self.group, self.consumer = log, stream, group, consumer
        self.dead_stream = log.keys.dead(tag_of(stream))
        self._dead = log.client.register_script(scripts.DEAD_LETTER)
        self._on_dead = on_dead_letter
        self._ensured = False

    def ensure_group(self, start: str = "0") -> None:
        """Create the group (and the stream) if missing; ``start`` '0' reads from the beginning."""
        with translate_errors(f"creating group {self.group} on {self.stream}"):
            try:
                self.log.client.xgroup_create(self.stream, self.group, id=start, mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
        self._ensured = True

    def read(self, *, count: int = 100, block_ms: int | None = 100) -> list[Entry]:
        """New entries for this consumer (blocking up to ``block_ms``; None means don't block)."""
        return self._read(">", count, block_ms)

    def pending(self, *, count: int = 100) -> list[Entry]:
        """Entries delivered to this consumer earlier but not acknowledged (e.g. before a crash)."""
        return self._read("0", count, None)

    def reclaim(self, *, min_idle_ms: int, count: int = 100) -> list[Entry]:
        """Take over entries another consumer left pending for at least ``min_idle_ms``."""
        if not self._ensured:
            self.ensure_group()
        out: list[Entry] = []
        start = "0-0"
        while True:
            with translate_errors(f"reclaiming from {self.stream}"):
                reply = self.log.client.xautoclaim(
                    self.stream, self.group, self.consumer, min_idle_time=min_idle_ms, start_id=start, count=count
                )
            nxt, claimed = reply[0], reply[1]
            out += self._decode_all(claimed)
            start = _s(nxt)
            if start == "0-0":
                return out

    def ack(self, *entry_ids: str) -> int:
        with translate_errors(f"acknowledging on {self.stream}"):
            return int(self.log.client.xack(self.stream, self.group, *entry_ids))

    def _read(self, start: str, count: int, block_ms: int | None) -> list[Entry]:
        if not self._ensured:
            self.ensure_group()
        with translate_errors(f"reading {self.stream}"):
            try:
                reply = self.log.client.xreadgroup(
                    self.group, self.consumer, {self.stream: start}, count=count, block=block_ms
                )
            except redis.ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                self.ensure_group()  # the stream was deleted under us; start again
                return []
        entries = reply[0][1] if reply else []
        return self._decode_all(entries)

    def _decode_all(self, entries: list) -> list[Entry]:
        out = []
        for raw_id, fields in entries:
            entry_id = _s(raw_id)
            if fields is None:  # deleted from the stream while pending: nothing to process
                self.ack(entry_id)
                continue
            try:
                env = decode_fields(fields, stream=self.stream, entry_id=entry_id)
            except DecodeError as exc:
                self.dead_letter(entry_id, fields, exc)
                continue
            out.append(Entry(self.stream, entry_id, env))
        return out

    def dead_letter(self, entry_id: str, fields: dict, error: DecodeError) -> None:
        args: list[object] = [self.group, entry_id, error.kind, error.reason]
        for k, v in fields.items():
            args += (k, v)
        with translate_errors(f"dead-lettering {self.stream} {entry_id}"):
            self._dead(keys=[self.stream, self.dead_stream], args=args)
        if self._on_dead is not None:
            self._on_dead(self.stream, entry_id, error)
