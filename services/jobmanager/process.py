"""The JobManager: win the lease, rebuild state from the log, then serve the inboxes.

It is split along its duties, each a small module:

* ``leadership``: the lease, the stall watchdog, and the page-by-page rebuild from the log;
* ``cluster``: the cluster inbox (TaskManagers joining, beating, leaving; jobs submitted);
* ``job_inboxes``: each job's inbox, its coordinators and the scheduling of its tasks;
* ``committer``: the only part that writes (fenced commits, delivery, dead letters).

The main loop is a step function, ``step()``, that does one thing at a time: try to take
the lease, replay a page of the log, or read one batch of messages and decide on it (plus
the timers when they are due). ``step_lease()`` renews the lease. The real process calls
them from its loop and a renewal thread (``run``); the simulation calls the same steps in
the order its seed picks. Nothing in a step sleeps, and time and ids come from ``world``.
"""

from __future__ import annotations

import gc
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sluice.errors import DecodeError, MessageRejected, RedisUnavailable, StaleEpoch, StoreRestarted
from sluice.events import (
    Envelope,
    Event,
    LeadershipGranted,
    LogRestarted,
    TaskManagerLost,
    TaskOperationResult,
    TaskState,
    UpdateTaskExecutionState,
)
from sluice.services.common.gauges import jobmanager_gauges
from sluice.services.common.metrics import JobManagerMetrics
from sluice.services.common.shell import RedisAway, get_logger, hostname, set_aside_reporter
from sluice.services.common.world import SYSTEM, World, monotonic_ms
from sluice.services.coordination.runtime import DEFAULT_CHECKPOINT_INTERVAL_MS, JobCoordinators
from sluice.services.jobs import core as jobs
from sluice.services.jobs.reconcile import Memory as SlotReports
from sluice.services.jobs.state import TERMINAL_JOB, JobsState
from sluice.services.jobs.timers import Timers
from sluice.services.membership.core import HeartbeatMonitor, Membership, MembershipConfig
from sluice.store import Blobs, Consumed, EventLog, GroupConsumer
from sluice.store.consumer import Entry

from .cluster import ClusterInbox
from .committer import Committer
from .job_inboxes import DuplicateCommit, HandlerFailed, JobInboxes
from .leadership import Lease, Rebuilt, Replay, SnapshotWriter, gc_paused
from .retention import FactRetention, Retention
from .unreadable import Unreadable, advice

__all__ = ["JobManager", "LeaderState", "GROUP"]

GROUP = "jobmanager"
LINGER_MS = 5
"""A batch of reports that decide nothing yet (a task's start acknowledged, INITIALIZING,
RUNNING) waits at most this long for more before it is decided: a short task's end comes
a millisecond or two after its start, and both are then one commit, not two (the leader's
CPU a task, ``sluice bench tasks``). A batch with anything else in it is decided at once."""

SERVE_AFTER_S = 1.0
"""How long a new leader rebuilds before it serves the cluster, rebuilding the jobs left
while it serves (as Flink's Dispatcher leads while its JobMasters recover their jobs)."""


@dataclass
class LeaderState:
    """What the leader holds in memory: folded from the log, plus soft state (liveness,
    coordinators)."""

    membership: Membership = field(default_factory=Membership)
    jobs: JobsState = field(default_factory=JobsState)
    monitor: HeartbeatMonitor = field(default_factory=HeartbeatMonitor)
    coords: dict[str, JobCoordinators] = field(default_factory=dict)
    reports: SlotReports = field(default_factory=SlotReports)
    """What the TaskManagers' slot reports showed lately (services/jobs/reconcile.py)."""
    timers: Timers = field(default_factory=Timers)
    """When slot waits and restart delays began, on this leader's clock (services/jobs/timers.py)."""


def _can_wait(entry: Entry) -> bool:
    """Whether a message decides nothing that should not wait a few milliseconds: a task's
    start acknowledged, or a task reaching INITIALIZING or RUNNING (no slot frees, nothing is
    deployed, no one waits on it)."""
    ev = entry.envelope.event
    if isinstance(ev, UpdateTaskExecutionState):
        return ev.state in (TaskState.INITIALIZING, TaskState.RUNNING)
    return isinstance(ev, TaskOperationResult) and ev.success


class JobManager:
    def __init__(
        self,
        log: EventLog,
        *,
        world: World = SYSTEM,
        config: MembershipConfig = MembershipConfig(),
        jobs_config: jobs.JobsConfig = jobs.JobsConfig(),
        lease_ttl_ms: int = 3000,
        jm_id: str | None = None,
        inbox_retention_ms: int = 600_000,
        storage_root: str = "file:///tmp/sluice-storage",
        max_stall_s: float = 60.0,
        checkpoint_interval_ms: int = DEFAULT_CHECKPOINT_INTERVAL_MS,
        batch: int = 500,
        replay_page: int = 1000,
        coordinator_executor: Callable[[str], Any] | None = None,
        serve_after_s: float | None = SERVE_AFTER_S,
        linger_ms: int = LINGER_MS,
        fact_retention: FactRetention | None = None,
        freeze_gc: bool = True,
    ) -> None:
        self.log, self.keys, self.world = log, log.keys, world
        self.config, self.jobs_config = config, jobs_config
        self.storage_root = storage_root
        self.inbox_retention_ms = inbox_retention_ms
        self.checkpoint_interval_ms = checkpoint_interval_ms
        self.coordinator_executor = coordinator_executor
        self.batch, self.replay_page = batch, replay_page
        self.freeze_gc = freeze_gc  # (see Replay: off where JobManagers share a process)
        self.serve_after_s = serve_after_s
        """A rebuild from the log longer than this serves the cluster while the jobs left are
        rebuilt (None: serve only once every job is)."""
        self.linger_ms = linger_ms
        """How long a read that brought only reports deciding nothing (``_can_wait``) waits
        for more before they are decided (0: never; only a step that may block waits)."""
        self.id = jm_id or f"jm-{hostname()}-{world.new_id()[:8]}"
        self.group = GROUP
        self.tag = self.keys.cluster
        self.inbox = self.keys.inbox(self.tag)
        self.logger = get_logger("jobmanager", jm=self.id)
        self.lease = Lease(log, self.id, lease_ttl_ms, max_stall_s, world.monotonic)
        self.metrics = JobManagerMetrics()
        self.metrics.collect_with(lambda: jobmanager_gauges(self))
        self.committer = _MeteredCommitter(log, world, self.id, GROUP, self.logger, self.metrics)
        self.blobs = Blobs(log)
        self.cluster = ClusterInbox(self)
        self.job_inboxes = JobInboxes(self)
        self.retention = Retention(self, fact_retention)
        """Trims the streams the leader serves and purges jobs (``fact_retention``: how long
        archived jobs' facts are kept; None: $SLUICE_FACT_RETENTION, by default for ever)."""
        self.state = LeaderState()
        self.registered: set[str] = set()
        self.purged: set[str] = set()
        """Jobs purged (``JobPurged``): their ids stay taken, their keys are gone."""
        self.consumer = GroupConsumer(log, self.inbox, GROUP, self.id, on_dead_letter=self._dead_lettered,
                                      sole=True)
        log.on_set_aside = set_aside_reporter(self.logger, self.metrics)
        self.phase = "standby"
        self.replay: Replay | None = None
        self.errors: list[BaseException] = []
        """Unexpected errors survived (each a bug; the simulation fails a seed on one)."""
        self._next_acquire = 0
        self.unreadable: Unreadable | None = None
        """A fact of the log this JobManager could not read (it handed the lease over), and
        when it looks again (None: none met)."""
        self.seen_server: str | None = None
        """The Redis run id this JobManager last saw; a different one later means a restart."""
        self.saw_restart: tuple[str, str] | None = None
        self._next_tick = 0
        self._behind_since: int | None = None
        self.timeouts_while_behind = False
        """Heartbeat timeouts are decided though the cluster inbox has not been read to its end
        (it has stayed behind for longer than the timeout): a live TaskManager may be lost."""
        self._announced = False
        self._took_lease = 0.0

    @property
    def epoch(self) -> int | None:
        return self.committer.epoch if self.phase != "standby" else None

    @property
    def leading(self) -> bool:
        return self.phase == "leading"

    # --- the steps -----------------------------------------------------------------------

    def step(self, *, block_ms: int | None = 0) -> bool:
        """One pass of the main loop; whether it did anything. Never raises for anything
        the cluster does (a deposed leader steps down, a restarted server or a bug makes it
        rebuild from the log) except RedisUnavailable, after which the caller waits."""
        try:
            return self._step(block_ms)
        except StaleEpoch as exc:
            self.logger.warning("deposed", error=str(exc))
            self.step_down()
        except StoreRestarted as exc:
            self.logger.warning("the Redis server restarted; rebuilding from the log", error=str(exc))
            self.step_down()
        except DuplicateCommit as exc:
            self.logger.warning("state behind the log; rebuilding from the log", why=str(exc))
            self.step_down()
        except HandlerFailed as exc:
            self._unexpected(exc.cause, f"deciding {exc.entry.envelope.type} failed")
            try:
                self.committer.park(exc.entry, "handler-failed", str(exc))
            finally:
                self.step_down()
        except DecodeError as exc:  # a fact it cannot read: another JobManager may (never spin on it)
            self._cannot_read(exc)
        except RedisUnavailable:
            self.step_down()
            raise
        except Exception as exc:  # a bug: never die; rebuild from the log and go on
            self._unexpected(exc, "unexpected error in the main loop")
            self.step_down()
        return True

    def step_lease(self) -> bool:
        """Renew the lease (from its own thread in the real process); False when not leading."""
        if self.phase == "standby" or self.lease.lost:
            return False
        why = self.lease.renew()
        if why is not None:
            self.logger.warning("lost the lease, stepping down", epoch=self.committer.epoch, why=why)
        return True

    def _step(self, block_ms: int | None) -> bool:
        self.lease.progress()
        if self.phase != "standby" and self.lease.lost:
            self.step_down()
            return True
        if self.phase == "standby":
            return self._try_lead()
        if self.phase == "replaying":
            assert self.replay is not None
            self.replay.step()
            if self.replay.ready():
                with gc_paused():  # restoring coordinators folds their tails: as much work as a page
                    self._take_over()
            return True
        if self.replay is not None:  # serving while the jobs left are rebuilt, a page per step
            self._recover_step()
        read_at = monotonic_ms(self.world)  # the view is at least this fresh (the call may stall after its read)
        entries = self.consumer.read(count=self.batch, block_ms=block_ms)
        taken = self.consumer.taken_over  # a deposed leader's reads, decided where they were sent
        caught_up = self.consumer.read_counts.get(self.inbox, 0) < self.batch
        if entries and block_ms and self.linger_ms and len(entries) < self.batch and all(map(_can_wait, entries)):
            # Only reports that decide nothing yet: wait a moment for what usually follows
            # them (a task's RUNNING and end), to decide it all in one commit, not two.
            left = self.batch - len(entries)
            entries += self.consumer.read(count=left, block_ms=self.linger_ms)
            taken += self.consumer.taken_over
            caught_up = self.consumer.read_counts.get(self.inbox, 0) < left
        if taken:
            self.logger.warning("took over messages a deposed leader read after losing its lease; deciding them "
                                "in the order they were sent", entries=taken)
        reports = self.state.reports
        reports.read(caught_up)  # slot reports read later were sent after what this read saw
        if entries:
            reports.reading = True
            try:
                self.handle_batch(entries)
            finally:
                reports.reading = False
        if reports.finals:  # on what this read saw of the jobs' inboxes
            self.job_inboxes.accept_lost_finals()
        if entries:
            self.job_inboxes.schedule_all()
        clock = monotonic_ms(self.world)  # (the tick's schedule: a wall-clock step back would stop it)
        if clock >= self._next_tick:
            self._check_server()
            # (the clock read again: the check may have stalled, and the view must be fresh after it)
            self.tick(self.world.now_ms(), caught_up=self._timeouts_ready(monotonic_ms(self.world), caught_up, read_at))
            self._next_tick = clock + min(self.config.heartbeat_interval_ms, 200)
        return bool(entries)

    def _check_server(self) -> None:
        """Notice a restart of Redis even while nothing is written (redis-py reconnects
        without a word): the state in memory may be ahead of what the server kept, so it
        is rebuilt from the log (``step`` steps down on StoreRestarted)."""
        server = self.log.server_id()
        if self.committer.server and server != self.committer.server:
            self.saw_restart = (self.committer.server, server)
            raise StoreRestarted(tag=self.tag, run_id=server)

    def _timeouts_ready(self, now: int, caught_up: bool, read_at: int) -> bool:
        """Whether heartbeat timeouts may be decided now: only on a fresh view of the cluster
        inbox, read to its end (heartbeats still waiting in a backlog, or sent while this
        step stalled after its read, would make live TaskManagers look lost). Never put off
        for longer than the timeout itself: a busy inbox or slow steps must not keep dead
        TaskManagers counted for ever. (``now`` and ``read_at``: the monotonic clock, in ms.)"""
        timeout = self.config.heartbeat_timeout_ms
        ready = caught_up and now - read_at <= timeout // 2
        if ready:
            self._behind_since = None
        elif self._behind_since is None:
            self._behind_since = now
        elif now - self._behind_since > timeout:
            if not self.timeouts_while_behind:
                self.logger.warning("the cluster inbox stays behind; deciding heartbeat timeouts anyway",
                                    behind_ms=now - self._behind_since, batch=self.batch)
            ready = True
        self.timeouts_while_behind = ready and self._behind_since is not None
        return ready

    def _try_lead(self) -> bool:
        if self.unreadable is not None and not self._may_read_again():
            return False
        clock = monotonic_ms(self.world)
        if clock < self._next_acquire:
            return False
        self._next_acquire = clock + max(self.lease.ttl_ms // 4, 1)
        server = self.log.server_id()
        if self.seen_server is not None and self.seen_server != server:
            self.saw_restart = (self.seen_server, server)  # even if the log kept no trace of it
        self.seen_server = server
        epoch = self.lease.try_acquire(server)
        if epoch is None:
            if not self._announced:
                holder = self.lease.lease.current()
                self.logger.info("standby", leader=holder.holder if holder else None,
                                 epoch=holder.epoch if holder else None)
                self._announced = True
            return False
        self._announced = False
        self._took_lease = self.world.monotonic()
        self.committer.begin(epoch, server)
        self.phase = "replaying"
        self.replay = Replay(self.log, self.committer.fence, page=self.replay_page, logger=self.logger,
                             monotonic=self.world.monotonic, serve_after_s=self.serve_after_s,
                             freeze_gc=self.freeze_gc)
        self.logger.info("replaying the log", epoch=epoch)
        return True

    def _cannot_read(self, exc: DecodeError) -> None:
        """A fact of the log this JobManager cannot read (services/jobmanager/unreadable.py):
        stop, hand the lease over at once (not committed with, when met before serving), and
        wait, longer each time, before looking again. Said once per entry."""
        served = self.phase == "leading"
        epoch = self.committer.epoch
        self.step_down()
        try:
            self.lease.release()
        except RedisUnavailable:
            pass  # it lapses
        self.metrics.log_unreadable.labels(exc.kind).inc()
        now = self.world.monotonic()
        if self.unreadable is not None and self.unreadable.same(exc):
            self.unreadable.again(now)
            self.logger.debug("still cannot read the log", stream=exc.stream, entry=exc.entry_id,
                              retry_in_s=self.unreadable.backoff_s)
            return
        wait = self.lease.ttl_ms / 1000
        self.unreadable = Unreadable(exc.stream, exc.entry_id, exc.reason, wait, now + wait)
        self.logger.error("cannot read the log it would lead: lease released", stream=exc.stream, entry=exc.entry_id,
                          epoch=epoch, served=served, error=f"{exc.kind}: {exc.reason}"[:500], what_to_do=advice(exc))

    def _may_read_again(self) -> bool:
        """Whether to try to lead again, after a fact this JobManager could not read: not
        before its wait is over, and not while that fact is still there (looked at without
        taking the lease)."""
        u = self.unreadable
        assert u is not None
        now = self.world.monotonic()
        if now < u.retry_at:
            return False
        there = u.still_there(self.log)
        if there:
            u.again(now)
            return False
        if there is False:
            self.logger.info("the fact this JobManager could not read is gone or readable: it may lead again",
                             stream=u.stream, entry=u.entry_id)
            self.unreadable = None
        return True

    def step_down(self) -> None:
        """Stop leading and forget the state (it is rebuilt from the log when leading again)."""
        if self.phase != "standby":
            self.job_inboxes.close_coordinators()
        if self.replay is not None and self.freeze_gc:  # abandoned midway: what it froze (gc.freeze) is garbage now
            gc.unfreeze()
        self.phase = "standby"
        self.replay = None
        self.committer.end()
        self.committer.on_facts = None
        self.state = LeaderState()
        self.snapshots: SnapshotWriter | None = None
        self._next_acquire = 0
        self.metrics.forget()

    def _unexpected(self, exc: BaseException, what: str) -> None:
        self.errors.append(exc)
        frames = traceback.extract_tb(exc.__traceback__)[-4:]
        where = " <- ".join(f"{f.name} ({f.filename.rsplit('/', 1)[-1]}:{f.lineno})" for f in reversed(frames))
        self.logger.error(what + "; rebuilding from the log", error=f"{type(exc).__name__}: {exc}"[:500], at=where)

    # --- taking over ---------------------------------------------------------------------

    def _take_over(self) -> None:
        """The cluster's facts and the jobs rebuilt so far are folded: announce the epoch,
        restore their coordinators, recover what the previous leader left undone, and
        serve. Jobs still being rebuilt (``recovering``) join one by one as their last page
        is folded (``_join_rebuilt``); until then their inboxes wait unread, and no task is
        scheduled (the slots they hold are not known yet)."""
        assert self.replay is not None
        r = self.replay.result
        epoch, server = self.committer.epoch, self.committer.server
        assert epoch is not None
        now = self.world.now_ms()
        self.state = LeaderState(r.membership, r.jobs)
        r.jobs.epoch = epoch  # what the cores fold as they decide carries it, as the committed facts do
        self.registered = set(r.registered)
        self.purged = set(r.purged)
        self.retention.reset()
        self.consumer = GroupConsumer(self.log, self.inbox, GROUP, self.id, on_dead_letter=self._dead_lettered,
                                      sole=True)
        rebuilt = self.replay.take_rebuilt()
        restoring = [(job_id, self._restore_coordinators(job_id, r)) for job_id in rebuilt]
        grant = r.last_grant
        granted = LeadershipGranted(epoch, self.id, hostname(), server)
        before = grant.server if grant is not None and grant.server and grant.server != server else None
        if before is None and self.saw_restart is not None and self.saw_restart[1] == server:
            before = self.saw_restart[0]  # the log lost even the last leader's grant: we remember
        if before is not None and not self.log.backend.durable():
            # Announced in the same commit as the new epoch, so a leader that dies right
            # after still leaves the restart on record for the next one. Its tasks are
            # failed below, once the coordinators run (they must see the facts in order).
            self.cluster.commit_facts([*self._log_restarted(before, server), granted], consequences=False)
        elif grant is None or (grant.epoch, grant.leader_id, grant.server) != (epoch, self.id, server):
            self.cluster.commit_facts([granted])
        else:
            granted = grant if grant is not None else granted  # the log's last grant is already ours
        for job_id, coords in restoring:
            self._start_coordinators(job_id, coords, r, now)
        self._renumber(now)
        self.state.monitor.restart(self.state.membership, monotonic_ms(self.world))
        # Deadlines of what the log has pending count from here at the earliest (services/jobs/timers.py).
        self.state.reports.leading_since = self.state.timers.started = monotonic_ms(self.world)
        for tag in [self.tag] + [self.keys.job(j) for j in rebuilt]:
            self.committer.deliver(tag)
        self.consumer.ensure_group()
        self.saw_restart = None
        self.snapshots = SnapshotWriter(self, r, granted)
        self.committer.on_facts = self.snapshots.committed
        for job_id in rebuilt:
            r.tails.pop(job_id, None)  # fed to the coordinators, and copied into the snapshot writer
        self.phase = "leading"
        recovering = len(self.replay.pending)
        if not recovering:
            self.replay = None
        self.logger.info("leading", epoch=epoch, replayed=r.facts, from_snapshots=r.from_snapshots,
                         archived=len(r.archived), taskmanagers=len(self.state.membership.active()),
                         jobs=len(self.state.jobs.jobs), recovering=recovering)
        # Messages a previous leader read but never committed: ours now (each once).
        self.handle_batch(self.consumer.recover())
        self._orphans(now)
        self.job_inboxes.schedule_all()
        self.metrics.recovery.observe(self.world.monotonic() - self._took_lease)

    def _restore_coordinators(self, job_id: str, r: Rebuilt) -> JobCoordinators | None:
        """Follow a rebuilt job's inbox (unless it ended) and create its coordinators, reset
        to their checkpoints (bound and started by ``_start_coordinators``)."""
        job = r.jobs.jobs.get(job_id)
        if job is None or job.status not in TERMINAL_JOB:  # archived jobs are not followed: loaded when asked about
            self.job_inboxes.follow(job_id)
        if job is not None and job.status not in TERMINAL_JOB:
            self.cluster.root.mark_restored(job)  # (one an older leader accepted has no marker)
        if job is None or not job.built or job.status in TERMINAL_JOB:
            return None
        # Coordinators exist before leadership is used: restored first, then bound and
        # started, then fed what happened after their checkpoints.
        coords = self.job_inboxes.create_coordinators(job_id)
        for op, (cid, cstate, attempts) in r.checkpoints.get(job_id, {}).items():
            coords.restore(op, cid, cstate, attempts)
        return coords

    def _start_coordinators(self, job_id: str, coords: JobCoordinators | None, r: Rebuilt, now: int) -> None:
        if coords is not None:
            coords.start(now)
            coords.replay(r.tails.get(job_id, {}))
            self.job_inboxes.commit(jobs.Decision(job_id=job_id, now=now))

    def _jobs(self, only: str | None) -> JobsState:
        """The leader's jobs, or a view of one of them (its run and the shared slot pool)."""
        state = self.state.jobs
        if only is None:
            return state
        run = state.jobs.get(only)
        return JobsState({only: run} if run is not None else {}, state.pool, state.epoch)

    def _renumber(self, now: int, only: str | None = None) -> None:
        """Jobs not yet renumbered above the attempt floor (a restart of Redis that may have lost
        writes; a leader that died while doing this): every unfinished attempt runs again."""
        members = self.state.membership
        restart = jobs.LogRestart(members.restart_reason, members.attempt_floor)
        for d in jobs.decide(self._jobs(only), restart, now).jobs:
            self.job_inboxes.commit(d)

    def _orphans(self, now: int, only: str | None = None) -> None:
        """Attempts placed on a TaskManager registration that is gone in the cluster's facts
        (the leader died between the two commits, the TaskManager registered again as a new
        session, or it was lost and registered again, under any session, after the attempt
        was placed, whichever leader committed the loss): failed now. Asked at take-over, and
        of each job rebuilt while serving when it joins: a fold of the log either way."""
        members = self.state.membership
        active = {row.resource_id: row.session for row in members.active()}
        registered = {row.resource_id: row.epoch for row in members.active()}
        reasons = {rid: row.reason or "" for rid, row in members.taskmanagers.items()}
        for d in jobs.decide(self._jobs(only), jobs.Orphans(active, reasons, self.jobs_config, registered), now).jobs:
            self.job_inboxes.commit(d)

    # --- jobs rebuilt while leading ----------------------------------------------------------

    @property
    def recovering(self) -> list[str]:
        """Live jobs this leader is still rebuilding from the log (it serves meanwhile)."""
        replay = self.replay  # read once: the metrics endpoint asks from its own thread
        return list(replay.pending) if replay is not None and self.leading else []

    def _recover_step(self) -> None:
        """A page of the rebuild of the jobs left when this leader began to serve."""
        assert self.replay is not None
        self.replay.step()
        self._join_rebuilt()

    def recover_now(self, job_id: str) -> None:
        """Rebuild a job still being recovered at once (a message about it cannot wait)."""
        assert self.replay is not None
        self.replay.rebuild_now(job_id, progress=self.lease.progress)  # each page is progress
        self._join_rebuilt()

    def _join_rebuilt(self) -> None:
        """Jobs whose rebuild ended: restored and served as a new leader's jobs are."""
        assert self.replay is not None
        r = self.replay.result
        now = self.world.now_ms()
        for job_id in self.replay.take_rebuilt():
            coords = self._restore_coordinators(job_id, r)
            self._start_coordinators(job_id, coords, r, now)
            job = r.jobs.jobs.get(job_id)
            if job is not None:  # the leader hears of its attempts now: older slot reports say nothing of them
                for ex in job.executions():
                    if ex.taskmanager is not None:
                        self.state.reports.heard(f"{job_id}/{ex.id}")
            self._renumber(now, job_id)
            self.committer.deliver(self.keys.job(job_id))
            if self.snapshots is not None:
                self.snapshots.rebuilt(job_id, r)
            r.tails.pop(job_id, None)
            inbox = self.keys.inbox(self.keys.job(job_id))
            if self.job_inboxes.following(job_id):
                self.handle_batch(self.consumer.recover(streams=[inbox]))
            self._orphans(now, job_id)
            self.logger.info("job recovered", job=job_id, status=job.status.value if job is not None else None,
                             left=len(self.replay.pending))
        if self.replay.done:
            self.logger.info("every job recovered", epoch=self.committer.epoch, replayed=r.facts,
                             jobs=len(self.state.jobs.jobs),
                             seconds=round(self.world.monotonic() - self._took_lease, 3))
            self.metrics.all_recovered.observe(self.world.monotonic() - self._took_lease)
            self.replay = None  # (waits for slots count from here at the earliest: services/jobs/timers.py)
            self.job_inboxes.schedule_all()

    def _log_restarted(self, before: str, now_server: str) -> list:
        """The Redis server restarted since the last leader took over, and does not keep every
        acknowledged write (``appendfsync everysec``, or unknown): it may have lost its last
        writes, so nothing that ran across the restart is trusted. The facts to commit with
        the new epoch: every TaskManager registers again (they drop their tasks when they see
        the restart), and every attempt not finished runs again under a number no lost write
        can have used (the server's clock: ``LogRestarted``'s floor)."""
        reason = (f"the Redis server restarted (run id {before[:8]} -> {now_server[:8]}) and may have lost its last "
                  "writes: every task that was not finished runs again")
        self.logger.warning("log restarted", reason=reason)
        floor = max(self.log.backend.time_ms(), self.state.membership.attempt_floor + 1)
        lost: list = [TaskManagerLost(row.resource_id, row.session, reason) for row in self.state.membership.active()]
        return [LogRestarted(before, now_server, floor, reason), *lost]

    # --- handling ------------------------------------------------------------------------

    def handle_batch(self, entries: list[Entry]) -> None:
        """Cluster messages one by one; each job's messages decided in order and committed
        together (one group commit per job and batch)."""
        self.metrics.handled_entries([e.envelope for e in entries])
        seen: set[tuple[str, str]] = set()
        by_job: dict[str, list[Entry]] = {}
        for entry in entries:
            key = (entry.stream, entry.id)
            if key in seen:
                continue  # never decide one entry twice
            seen.add(key)
            if entry.stream == self.inbox:
                try:
                    self.cluster.handle(entry)
                except MessageRejected as exc:
                    self.committer.park(entry, exc.kind, str(exc))
                except (StaleEpoch, StoreRestarted, RedisUnavailable, DuplicateCommit, HandlerFailed):
                    raise
                except Exception as exc:
                    raise HandlerFailed(entry, exc) from exc
            else:
                by_job.setdefault(entry.stream, []).append(entry)
        for stream, group in by_job.items():
            self.job_inboxes.handle(stream, group)

    def tick(self, now: int, *, caught_up: bool = True) -> None:
        # Entries another consumer read and never committed (it crashed, or it was a
        # deposed leader that read one more message before learning so): ours now.
        self.handle_batch(self.consumer.reclaim(min_idle_ms=self.lease.ttl_ms))
        if caught_up:  # heartbeats still waiting in the inbox would make live TaskManagers look lost
            self.cluster.timeouts(now)
        self.job_inboxes.tick(now)
        self.job_inboxes.schedule_all()
        self.committer.heartbeat(row.resource_id for row in self.state.membership.active())
        self.committer.flush_cursors()
        self.retention.tick(now)
        snapshots = getattr(self, "snapshots", None)
        if snapshots is not None:  # ended jobs are archived at once; the rest every interval
            snapshots.tick(now)

    def _dead_lettered(self, stream: str, entry_id: str, error: Exception) -> None:
        self.metrics.parked(getattr(error, "kind", "undecodable"))
        self.logger.warning("entry parked in dead letters", stream=stream, entry=entry_id, error=str(error)[:300])

    # --- the real process ----------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Stand by until leading, lead until deposed or stopped; survive Redis outages."""
        renewer = threading.Thread(target=self._renew_loop, args=(stop,), name="lease-renewal", daemon=True)
        renewer.start()
        away = RedisAway(self.logger)
        try:
            while not stop.is_set():
                try:
                    if away.since is not None:  # a standby's step may not touch Redis: ask it
                        self.log.server_id()
                        away.back()
                    did = self.step(block_ms=50 if self.leading and self.replay is None else None)
                except RedisUnavailable as exc:  # it stepped down: it rebuilds from the log when back
                    stop.wait(away.away(exc))
                    continue
                if not did and self.phase == "standby":
                    stop.wait(self.lease.ttl_ms / 4000)
        finally:
            stop.set()
            renewer.join()
            if self.phase != "standby":
                self.job_inboxes.close_coordinators()
                try:
                    self.committer.flush_cursors()  # the next leader starts where delivery ended
                    self.lease.release()
                    self.logger.info("released leadership", epoch=self.committer.epoch)
                except RedisUnavailable:
                    pass

    def _renew_loop(self, stop: threading.Event) -> None:
        every = self.lease.ttl_ms / 3000
        while not stop.wait(every):
            try:
                self.step_lease()
            except RedisUnavailable:
                continue  # the main loop sees it too; the lease may still be ours
            except Exception as exc:  # never let the renewal thread die silently
                self._unexpected(exc, "lease renewal failed")


class _MeteredCommitter(Committer):
    """The committer, counting what it writes for the metrics (services/common/metrics.py)."""

    def __init__(self, log: EventLog, world: World, jm_id: str, group: str, logger: Any,
                 metrics: JobManagerMetrics) -> None:
        super().__init__(log, world, jm_id, group, logger)
        self.metrics = metrics

    def commit(self, tag: str, facts: Sequence[Event], *, sends: Sequence[tuple[str, Event]] = (),
               consumed: Consumed | None = None, cause: str | None = None,
               deliver_to: dict[int, str] | None = None, now: int | None = None) -> list[Envelope] | None:
        envs = super().commit(tag, facts, sends=sends, consumed=consumed, cause=cause, deliver_to=deliver_to,
                              now=now)
        if envs is not None:
            self.metrics.committed(envs, [ev for _, ev in sends], self.world.now_ms())
        return envs

    def park(self, entry: Entry, kind: str, reason: str) -> None:
        super().park(entry, kind, reason)
        self.metrics.parked(kind)

    def _undeliverable(self, entry_id: str, target: str, reason: str) -> None:
        super()._undeliverable(entry_id, target, reason)
        self.metrics.parked("undeliverable")
