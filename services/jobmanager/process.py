"""The JobManager shell: win the lease, rebuild state from the log, then serve the inbox.

One main loop does everything that changes state: it reads the cluster inbox, asks
the pure core what each message causes, and commits the facts, the replies (into the
outbox) and the inbox acknowledgement in one fenced script. Timers (heartbeats, lease
renewal) run in the same loop between reads.
"""

from __future__ import annotations

import threading
import time

from sluice.errors import DecodeError, RedisUnavailable, StaleEpoch
from sluice.events import Envelope, Event, JobManagerHeartbeat, LeadershipGranted
from sluice.services.common.shell import get_logger, hostname, new_id, now_ms
from sluice.services.membership.core import (
    Decision,
    HeartbeatMonitor,
    Membership,
    MembershipConfig,
    UnexpectedMessage,
    decide,
    decide_timeouts,
    evolve,
)
from sluice.store import Consumed, Deliverer, EventLog, GroupConsumer, LeaderLease, Out
from sluice.store.consumer import Entry

__all__ = ["JobManager", "GROUP"]

GROUP = "jobmanager"


class JobManager:
    def __init__(
        self,
        log: EventLog,
        *,
        config: MembershipConfig = MembershipConfig(),
        lease_ttl_ms: int = 3000,
        jm_id: str | None = None,
        inbox_retention_ms: int = 600_000,
    ) -> None:
        self.inbox_retention_ms = inbox_retention_ms
        self._next_trim = 0
        self.log = log
        self.keys = log.keys
        self.config = config
        self.id = jm_id or f"jm-{hostname()}-{new_id()[:8]}"
        self.lease = LeaderLease(log, self.id, lease_ttl_ms)
        self.tag = self.keys.cluster
        self.inbox = self.keys.inbox(self.tag)
        self.facts = self.keys.facts(self.tag)
        self.outbox = self.keys.outbox(self.tag)
        self.state = Membership()
        self.monitor = HeartbeatMonitor()
        self.epoch: int | None = None
        self.logger = get_logger("jobmanager", jm=self.id)
        self.deliverer = Deliverer(log, self.tag)
        self.consumer = GroupConsumer(log, self.inbox, GROUP, self.id, on_dead_letter=self._dead_lettered)

    # --- lifecycle -----------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Stand by until leading, lead until deposed or stopped; survive Redis outages."""
        backoff = 0.1
        announced = False
        while not stop.is_set():
            try:
                epoch = self.lease.try_acquire()
                if epoch is None:
                    if not announced:
                        holder = self.lease.current()
                        self.logger.info("standby", leader=holder.holder if holder else None,
                                         epoch=holder.epoch if holder else None)
                        announced = True
                    stop.wait(self.lease.ttl_ms / 4000)
                    continue
                announced = False
                backoff = 0.1
                self.lead(epoch, stop)
            except StaleEpoch as exc:
                self.logger.warning("deposed", error=str(exc))
                self.epoch = None
            except RedisUnavailable as exc:
                self.logger.error("redis unavailable, retrying", error=str(exc), retry_in_s=backoff)
                self.epoch = None
                stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
        if self.epoch is not None:
            try:
                self.lease.release()
                self.logger.info("released leadership", epoch=self.epoch)
            except RedisUnavailable:
                pass

    def become_leader(self, epoch: int) -> None:
        """Rebuild state from the log and announce the new epoch (no message is served before)."""
        self.epoch = epoch
        state = Membership()
        n = 0
        for _, env in self.log.replay(self.facts):
            evolve(state, env)
            n += 1
        self.state = state
        self._commit((LeadershipGranted(epoch, self.id, hostname()),), (), None)
        self.monitor.restart(self.state, now_ms())
        self.deliverer.deliver()
        self.consumer.ensure_group()
        self.logger.info("leading", epoch=epoch, replayed=n, taskmanagers=len(self.state.active()))
        # Messages a previous leader read but never committed: ours now.
        for entry in self.consumer.reclaim(min_idle_ms=0) + self.consumer.pending():
            self.handle(entry)

    def lead(self, epoch: int, stop: threading.Event) -> None:
        self.become_leader(epoch)
        interval = self.config.heartbeat_interval_ms
        renew_every = self.lease.ttl_ms / 3
        next_tick = next_renew = 0.0
        while not stop.is_set():
            for entry in self.consumer.read(count=100, block_ms=min(50, interval)):
                self.handle(entry)
            now = now_ms()
            if now >= next_tick:
                self.tick(now)
                next_tick = now + interval
            if now >= next_renew:
                if not self.lease.renew():
                    self.logger.warning("lost the lease, stepping down", epoch=epoch)
                    self.epoch = None
                    return
                next_renew = now + renew_every

    # --- handling ------------------------------------------------------------------------

    def handle(self, entry: Entry) -> None:
        env = entry.envelope
        try:
            decision = decide(self.state, env, self.config)
        except UnexpectedMessage as exc:
            self.consumer.dead_letter(entry.id, {b"e": _reencode(env)}, _Rejected(str(exc)))
            return
        except Exception as exc:  # a bug in the core must not kill the JobManager
            self.logger.exception("handler failed; entry parked", entry=entry.id, type=env.type)
            self.consumer.dead_letter(entry.id, {b"e": _reencode(env)}, _Rejected(f"handler failed: {exc!r}"))
            return
        if self._commit(decision.facts, decision.replies, entry, cause=env.id):
            msg = env.event
            rid = getattr(msg, "resource_id", None)
            if rid is not None and self.state.is_registered(rid, getattr(msg, "session", "")):
                self.monitor.observe(rid, now_ms())

    def tick(self, now: int) -> None:
        # Entries another consumer read and never committed (it crashed, or it was a
        # deposed leader that read one more message before learning so): ours now.
        for entry in self.consumer.reclaim(min_idle_ms=self.lease.ttl_ms):
            self.handle(entry)
        decision = decide_timeouts(self.state, self.monitor, now, self.config)
        if decision.facts:
            for fact in decision.facts:
                self.logger.warning("taskmanager lost", resource_id=fact.resource_id, reason=fact.reason)
            self._commit(decision.facts, (), None)
        self._send_heartbeats()
        if now >= self._next_trim:
            self.log.trim_consumed(self.inbox, GROUP, keep_ms=self.inbox_retention_ms, now_ms=now)
            self._next_trim = now + min(self.inbox_retention_ms, 10_000)

    def _send_heartbeats(self) -> None:
        active = self.state.active()
        if not active:
            return
        from sluice.events import FIELD, encode

        pipe = self.log.client.pipeline(transaction=False)
        hb = encode(Envelope(JobManagerHeartbeat(self.epoch or 0, self.id), new_id(), self.epoch or 0, now_ms()))
        for row in active:
            pipe.xadd(self.keys.inbox(self.keys.taskmanager(row.resource_id)), {FIELD: hb})
        try:
            pipe.execute()
        except Exception as exc:
            raise RedisUnavailable(f"Redis went away while sending heartbeats: {exc}") from exc

    def _commit(self, facts: tuple[Event, ...], replies: tuple[tuple[str, Event], ...],
                entry: Entry | None, cause: str | None = None) -> bool:
        assert self.epoch is not None
        ts = now_ms()
        fact_envs = [Envelope(f, new_id(), self.epoch, ts, None, cause) for f in facts]
        outs = [Out(self.facts, e) for e in fact_envs]
        outs += [
            Out(self.outbox, Envelope(r, new_id(), self.epoch, ts, None, cause),
                to=self.keys.inbox(self.keys.taskmanager(rid)))
            for rid, r in replies
        ]
        consumed = Consumed(self.inbox, GROUP, entry.id) if entry is not None else None
        result = self.log.commit(self.tag, self.epoch, outs, consumed)
        if result.duplicate:
            self.logger.info("redelivered entry ignored", entry=entry.id if entry else None)
            return False
        for env in fact_envs:
            evolve(self.state, env)
            if env.type in ("TaskManagerLost", "TaskManagerUnregistered"):
                self.monitor.forget(env.event.resource_id)
        if replies:
            self.deliverer.deliver()
        return True

    def _dead_lettered(self, stream: str, entry_id: str, error: DecodeError) -> None:
        self.logger.warning("entry parked in dead letters", stream=stream, entry=entry_id, error=str(error))


class _Rejected(DecodeError):
    kind = "rejected"


def _reencode(env: Envelope) -> bytes:
    from sluice.events import encode

    return encode(env)
