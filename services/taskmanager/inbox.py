"""A TaskManager's inbox: read a batch, act on each entry once, acknowledge, trim.

Each entry is handled once: one read again (after a Redis error while acknowledging it)
is known by its envelope id and skipped. After an error mid-step the next read takes what
was read but not acknowledged (``recover``). An entry that cannot be decoded is parked in
the dead letters by the consumer, and counted here.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from sluice.services.common.metrics import TaskManagerMetrics
from sluice.services.common.world import World
from sluice.store import EventLog, GroupConsumer
from sluice.store.consumer import Entry

from .reports import REMEMBERED

__all__ = ["Inbox", "GROUP"]

GROUP = "taskmanager"


class Inbox:
    def __init__(
        self,
        log: EventLog,
        world: World,
        resource_id: str,
        *,
        retention_ms: int,
        logger: Any,
        metrics: TaskManagerMetrics,
    ) -> None:
        self.log, self.world, self.logger, self.metrics = log, world, logger, metrics
        self.stream = log.keys.inbox(log.keys.taskmanager(resource_id))
        self.consumer = GroupConsumer(log, self.stream, GROUP, resource_id, on_dead_letter=self._dead_lettered)
        self.retention_ms = retention_ms
        """How long consumed entries are kept for inspection."""
        self.next_trim = 0
        """When (monotonic ms) consumed entries are trimmed next."""
        self.handled: OrderedDict[str, None] = OrderedDict()
        """Envelope ids of the entries handled lately, oldest first."""
        self.recovering = False
        """Whether the next read takes what was read but not acknowledged (a step failed)."""

    def read(self, block_ms: int | None) -> list[Entry]:
        """The next batch: what was left pending when recovering, else new entries."""
        if self.recovering:
            entries = self.consumer.pending()
            self.recovering = False
        else:
            entries = self.consumer.read(count=100, block_ms=block_ms)
        self.metrics.handled(e.envelope.type for e in entries)
        return entries

    def ack(self, entries: list[Entry]) -> None:
        """One acknowledgement for the batch, sent with the next read: an entry handled but not
        yet acknowledged when a step fails is read again and skipped (``handled``); a new
        session of this TaskManager drops what is left pending."""
        if entries:
            self.consumer.ack_later(*(e.id for e in entries))

    def is_new(self, entry: Entry) -> bool:
        return entry.envelope.id not in self.handled

    def done(self, entry: Entry) -> None:
        """``entry`` was handled: it is skipped if read again."""
        self.handled[entry.envelope.id] = None
        if len(self.handled) > REMEMBERED:
            self.handled.popitem(last=False)

    def recover(self) -> None:
        """A step failed: handle again what was read but not acknowledged."""
        self.recovering = True

    def skip(self) -> None:
        """Skip what the inbox holds: messages to an earlier session are void."""
        self.consumer.skip_to_end()

    def trim(self, now: int) -> None:
        """Drop the consumed entries older than the retention, now and then (``now``: the
        monotonic clock, as a wall-clock step back would put it off)."""
        if now >= self.next_trim:
            # What is kept: entry ids (the Redis server's clock) against this host's wall clock,
            # for inspection only; a skew keeps that much more or less, which nothing relies on.
            self.log.trim_consumed(self.stream, GROUP, keep_ms=self.retention_ms, now_ms=self.world.now_ms())
            self.next_trim = now + min(self.retention_ms, 10_000)

    def close(self) -> None:
        """Send the acknowledgements still held (tidy: a next session would drop them anyway)."""
        try:
            self.consumer.flush_acks()
        except Exception:  # Redis away, or refusing: the workers must stop all the same
            pass

    def _dead_lettered(self, stream: str, entry_id: str, error: Exception) -> None:
        self.metrics.parked(getattr(error, "kind", "undecodable"))
        self.logger.warning("entry parked in dead letters", stream=stream, entry=entry_id, error=str(error)[:300])
