"""The TaskManager shell: registration, heartbeats and a graceful goodbye."""

from __future__ import annotations

import sys
import threading

from sluice.errors import RedisUnavailable
from sluice.events import Envelope, UnregisterTaskManager
from sluice.services.common.shell import get_logger, hostname, new_id, now_ms
from sluice.store import EventLog, GroupConsumer, current_leader

from .core import Registration, RegistrationConfig

__all__ = ["TaskManager"]

GROUP = "taskmanager"


class TaskManager:
    def __init__(self, log: EventLog, *, resource_id: str | None = None, slots: int = 1,
                 host: str | None = None, config: RegistrationConfig = RegistrationConfig(),
                 labels: dict[str, str] | None = None, inbox_retention_ms: int = 600_000) -> None:
        self.inbox_retention_ms = inbox_retention_ms
        self._next_trim = 0
        self.log = log
        self.keys = log.keys
        host = host if host is not None else hostname()
        self.resource_id = resource_id or f"tm-{host}-{new_id()[:8]}"
        self.reg = Registration(self.resource_id, new_id(), host, slots, config, labels or {})
        self.inbox = self.keys.inbox(self.keys.taskmanager(self.resource_id))
        self.cluster_inbox = self.keys.inbox(self.keys.cluster)
        self.logger = get_logger("taskmanager", tm=self.resource_id)
        self.consumer = GroupConsumer(log, self.inbox, GROUP, self.resource_id, on_dead_letter=self._dead_lettered)

    def run(self, stop: threading.Event) -> int:
        """Serve until stopped (0) or refused for good (2)."""
        self._skip_old_messages()
        self.logger.info("starting", slots=self.reg.slots, session=self.reg.session, host=self.reg.host)
        last_state = self.reg.state
        backoff = 0.1
        while not stop.is_set():
            try:
                self._step()
                backoff = 0.1
            except RedisUnavailable as exc:
                self.logger.error("redis unavailable, retrying", error=str(exc), retry_in_s=backoff)
                stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            if self.reg.state != last_state:
                self.logger.info("registration", state=self.reg.state, why=self.reg.history[-1], epoch=self.reg.epoch)
                last_state = self.reg.state
            if self.reg.state == "REFUSED":
                self.logger.error("registration refused for good", reason=self.reg.refusal)
                print(f"sluice taskmanager {self.resource_id}: registration refused: {self.reg.refusal}", file=sys.stderr)
                return 2
        self._leave()
        return 0

    def _step(self) -> None:
        for entry in self.consumer.read(count=100, block_ms=50):
            for send in self.reg.receive(entry.envelope.event, now_ms()):
                self._send(send.message, cause=entry.envelope.id)
            self.consumer.ack(entry.id)
        now = now_ms()
        if now >= self._next_trim:
            self.log.trim_consumed(self.inbox, GROUP, keep_ms=self.inbox_retention_ms, now_ms=now)
            self._next_trim = now + min(self.inbox_retention_ms, 10_000)
        leader = current_leader(self.log)
        for send in self.reg.tick(now_ms(), leader.epoch if leader else None, self.reg.slots):
            self._send(send.message)

    def _send(self, message: object, cause: str | None = None) -> None:
        self.log.append(self.cluster_inbox, Envelope(message, new_id(), 0, now_ms(), None, cause))  # type: ignore[arg-type]

    def _skip_old_messages(self) -> None:
        """Messages to an earlier session of this resource id are void: start after them."""
        self.consumer.ensure_group("$")
        self.log.client.xgroup_setid(self.inbox, GROUP, "$")

    def _leave(self) -> None:
        if self.reg.state != "REGISTERED":
            return
        try:
            self._send(UnregisterTaskManager(self.resource_id, self.reg.session, "stopped gracefully"))
            self.logger.info("unregistered", reason="stopped gracefully")
        except RedisUnavailable as exc:
            self.logger.warning("could not say goodbye; the leader will time this TaskManager out", error=str(exc))

    def _dead_lettered(self, stream: str, entry_id: str, error: Exception) -> None:
        self.logger.warning("entry parked in dead letters", stream=stream, entry=entry_id, error=str(error))


