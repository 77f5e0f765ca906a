"""The JobManager's only writer: fenced commits, outbox delivery, dead letters, heartbeats.

Every other part of the JobManager decides; the committer writes. A commit carries the
leader's epoch (a deposed leader is refused: ``StaleEpoch``) and the run id of the Redis
server the leader rebuilt its state from (a server that restarted since, and may have
lost writes, is refused: ``StoreRestarted``), so nothing a stale memory holds reaches
the log.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sluice.errors import PartlyAppended
from sluice.events import Envelope, Event, JobManagerHeartbeat
from sluice.services.common.metrics import JobManagerMetrics
from sluice.services.common.world import World
from sluice.store import CommitResult, Consumed, Deliverer, EventLog, KvStates, Out
from sluice.store.consumer import Entry, dead_letter

__all__ = ["Committer", "MeteredCommitter", "Send"]

Send = tuple[str, Event]
"""A message for another tag's inbox: (inbox key, message), delivered through the outbox."""

DELIVER_PAGE = 2048
"""Outbox entries read and handed over a page at a time: a deployment pass's thousand
SubmitTasks in one page (at 500 a page they took two pages and a third, empty read: some
25 round trips to ten TaskManagers instead of 13)."""


class Committer:
    def __init__(self, log: EventLog, world: World, jm_id: str, group: str, logger: Any) -> None:
        self.log, self.world, self.id, self.group, self.logger = log, world, jm_id, group, logger
        self.keys = log.keys
        self.epoch: int | None = None
        self.server = ""
        self._deliverers: dict[str, Deliverer] = {}
        self.rewind = False
        """Each tag's first delivery of this leadership starts at its outbox's first entry: a
        shard of the log failed over (services/jobmanager/restarts.py), and an inbox on it may
        have lost what was delivered to it (``Deliverer.rewind``)."""
        self._rewound: set[str] = set()
        self.on_facts: Callable[[str, list[tuple[str, Envelope]]], None] | None = None
        """Told each commit's facts, with their entry ids, once they are in the log (the
        snapshot writer follows a job's facts without reading them back)."""

    def begin(self, epoch: int, server: str) -> None:
        """Write as the leader of ``epoch``, for the server whose run id is ``server``."""
        self.epoch, self.server = epoch, server
        self.rewind = False
        self._rewound.clear()

    def end(self) -> None:
        self.epoch = None

    # --- commits ---
    def commit(
        self,
        tag: str,
        facts: Sequence[Event],
        *,
        sends: Sequence[Send] = (),
        consumed: Consumed | None = None,
        cause: str | None = None,
        deliver_to: dict[int, str] | None = None,
        now: int | None = None,
    ) -> list[Envelope] | None:
        """Append ``facts`` to the tag's fact stream and ``sends`` to its outbox, and
        acknowledge ``consumed``, in one fenced script; then deliver the outbox. Facts
        whose index is in ``deliver_to`` are also written to that inbox of the same tag (a
        subtask's inbox). Returns the facts' envelopes, or None when ``consumed`` was
        already acknowledged (a redelivery: nothing was written)."""
        if self.epoch is None:
            raise RuntimeError("the committer writes only for a leader")
        ts = self.world.now_ms() if now is None else now
        job = self.keys.job_id_of(tag)
        envs = [Envelope(f, self.world.new_id(), self.epoch, ts, job, cause) for f in facts]
        facts_stream = self.keys.facts(tag)
        outs = [Out(facts_stream, e) for e in envs]
        for i, inbox in (deliver_to or {}).items():
            outs.append(Out(inbox, envs[i]))
        outbox = self.keys.outbox(tag)
        outs += [
            Out(outbox, Envelope(msg, self.world.new_id(), self.epoch, ts, job, cause), to=target)
            for target, msg in sends
        ]
        if not outs and consumed is None:
            return envs
        d = self._deliverers.get(tag)
        advance = d.carry(self.server) if d is not None else None
        result = self.log.commit(tag, self.epoch, outs, consumed, server=self.server, advance=advance)
        if result.duplicate:
            self.logger.info("redelivered entry ignored", entries=consumed.ids if consumed else None)
            return None
        if d is not None and advance is not None:
            d.carried(advance)
        if envs and self.on_facts is not None:
            self.on_facts(tag, list(zip(result.ids[: len(envs)], envs)))
        if sends:
            self.deliver(tag, result)
        return envs

    def fence(self, tag: str) -> None:
        """Claim a tag: from now on a deposed leader cannot write to it."""
        assert self.epoch is not None
        self.log.fence(tag, self.epoch, server=self.server)

    # --- delivery ---
    def deliver(self, tag: str, committed: CommitResult | None = None) -> int:
        """Deliver the tag's outbox; ``committed``: the commit that just wrote to it (its
        entries are handed over without reading them back when nothing precedes them).
        The cursor's move is owed: the tag's next commit carries it, or ``flush_cursors``
        makes it (a round trip a task less; ``Deliverer.owed``)."""
        d = self._deliverers.get(tag)
        if d is None:
            d = self._deliverers[tag] = Deliverer(self.log, tag, on_undeliverable=self._undeliverable)
        if self.rewind and tag not in self._rewound:
            self._rewound.add(tag)
            d.rewind()
        return d.deliver(batch=DELIVER_PAGE, server=self.server, committed=committed, lazy=True)

    def retire(self, tag: str) -> None:
        """A tag the leader is done with (an archived job): its cursor's move made, its
        deliverer forgotten (a later commit to it makes a new one, from the cursor)."""
        d = self._deliverers.get(tag)
        if d is not None:
            self._flush(d)
            del self._deliverers[tag]

    def flush_cursors(self) -> None:
        """Move every outbox cursor still owed (the leader's tick: a tag that commits no more
        has its cursor moved within a tick). A move owed on another server (Redis restarted
        since: it kept this leader's deliverers) is dropped, not made: the server refuses it,
        and what it stood for may be lost with the writes."""
        for d in self._deliverers.values():
            self._flush(d)

    def _flush(self, d: Deliverer) -> None:
        d.forget_owed_unless(self.server)
        d.flush()

    def _undeliverable(self, entry_id: str, target: str, reason: str) -> None:
        self.logger.warning("outbox entry parked in dead letters", entry=entry_id, target=target[:80], reason=reason)

    # --- dead letters ---
    def park(self, entry: Entry, kind: str, reason: str) -> None:
        """Acknowledge an inbox entry no decision can take, parking it with ``reason``."""
        from sluice.events import FIELD, encode

        dead_letter(self.log, entry.stream, self.group, entry.id, {FIELD: encode(entry.envelope)}, kind, reason)
        self.logger.warning(
            "entry parked in dead letters",
            stream=entry.stream,
            entry=entry.id,
            type=entry.envelope.type,
            reason=reason[:300],
        )

    # --- unfenced writes ---
    def heartbeat(self, resource_ids: Iterable[str]) -> None:
        """The leader's heartbeat to each TaskManager (soft state: nothing is decided by it)."""
        epoch = self.epoch or 0
        hb = Envelope(JobManagerHeartbeat(epoch, self.id), self.world.new_id(), epoch, self.world.now_ms())
        targets = [(self.keys.inbox(self.keys.taskmanager(rid)), hb) for rid in resource_ids]
        if targets:
            try:
                self.log.append_each(targets)
            except PartlyAppended as exc:  # an inbox written again as another kind of value at once
                self.logger.warning(
                    "a heartbeat was refused",
                    refused=[targets[i][0] for i in exc.errors],
                    error=next(iter(exc.errors.values()))[:300],
                )

    def retire_state(self, job_id: str, state_ids: list[str]) -> None:
        """Delete the queryable state of attempts that ended (after the facts saying so)."""
        KvStates(self.log.backend, self.keys).delete(job_id, state_ids)


class MeteredCommitter(Committer):
    """The committer, counting what it writes for the metrics (services/common/metrics.py)."""

    def __init__(
        self, log: EventLog, world: World, jm_id: str, group: str, logger: Any, metrics: JobManagerMetrics
    ) -> None:
        super().__init__(log, world, jm_id, group, logger)
        self.metrics = metrics

    def commit(
        self,
        tag: str,
        facts: Sequence[Event],
        *,
        sends: Sequence[tuple[str, Event]] = (),
        consumed: Consumed | None = None,
        cause: str | None = None,
        deliver_to: dict[int, str] | None = None,
        now: int | None = None,
    ) -> list[Envelope] | None:
        envs = super().commit(tag, facts, sends=sends, consumed=consumed, cause=cause, deliver_to=deliver_to, now=now)
        if envs is not None:
            self.metrics.committed(envs, [ev for _, ev in sends], self.world.now_ms())
        return envs

    def park(self, entry: Entry, kind: str, reason: str) -> None:
        super().park(entry, kind, reason)
        self.metrics.parked(kind)

    def _undeliverable(self, entry_id: str, target: str, reason: str) -> None:
        super()._undeliverable(entry_id, target, reason)
        self.metrics.parked("undeliverable")
