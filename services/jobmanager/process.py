"""The JobManager: win the lease, rebuild state from the log, then serve the inboxes.

Its duties are split into small modules, listed in the package's docstring
(services/jobmanager/__init__.py); each collaborator is built from the few things it uses,
and none of them sees the JobManager, which is the shell: it owns the phase and the steps.

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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sluice.errors import DecodeError, RedisUnavailable, StaleEpoch, StoreRestarted
from sluice.events import JobRegistered, LeadershipGranted
from sluice.services.common.gauges import jobmanager_gauges
from sluice.services.common.metrics import JobManagerMetrics
from sluice.services.common.shell import get_logger, hostname, set_aside_reporter
from sluice.services.common.world import SYSTEM, World, monotonic_ms
from sluice.services.coordination.runtime import DEFAULT_CHECKPOINT_INTERVAL_MS
from sluice.services.jobs import core as jobs
from sluice.services.membership.core import MembershipConfig
from sluice.store import Blobs, EventLog, GroupConsumer
from sluice.store.consumer import Entry

from .assembly import Ports, Settings, assemble
from .batches import LINGER_MS, read_batch, route
from .cluster import TimeoutGate
from .committer import MeteredCommitter
from .job_inboxes import DuplicateCommit, HandlerFailed
from .leadership import Lease, Replay, gc_paused
from .restarts import ServerWatch, announce, reconcile, rewinds
from .retention import FactRetention
from .runner import ProcessLoop
from .snapshot import SnapshotWriter
from .state import LeaderState, Phase
from .unreadable import Unreadable, UnreadableWatch

if TYPE_CHECKING:
    from prometheus_client.core import Metric

__all__ = ["JobManager", "LeaderState", "Phase", "GROUP", "LINGER_MS", "SERVE_AFTER_S"]

GROUP = "jobmanager"
_REBUILDS = {
    StaleEpoch: ("deposed", "error"),
    StoreRestarted: ("the Redis server restarted; rebuilding from the log", "error"),
    DuplicateCommit: ("state behind the log; rebuilding from the log", "why"),
}
"""What a step says (and under which key) when the log moved on without it; it then rebuilds."""
SERVE_AFTER_S = 1.0
"""How long a new leader rebuilds before it serves the cluster, rebuilding the jobs left
while it serves (as Flink's Dispatcher leads while its JobMasters recover their jobs)."""


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
        self.checkpoint_interval_ms = checkpoint_interval_ms
        self.coordinator_executor = coordinator_executor
        self.batch, self.replay_page = batch, replay_page
        self.freeze_gc = freeze_gc  # (see Replay: off where JobManagers share a process)
        self.serve_after_s = serve_after_s
        """A rebuild from the log longer than this serves the cluster while the jobs left are
        rebuilt (None: serve only once every job is)."""
        self.linger_ms = linger_ms
        """How long a read that brought only reports deciding nothing (``batches.can_wait``) waits
        for more before they are decided (0: never; only a step that may block waits)."""
        self.id = jm_id or f"jm-{hostname()}-{world.new_id()[:8]}"
        self.group = GROUP
        self.tag = self.keys.cluster
        self.inbox = self.keys.inbox(self.tag)
        self.logger = get_logger("jobmanager", jm=self.id)
        self.lease = Lease(log, self.id, lease_ttl_ms, max_stall_s, world.monotonic)
        self.metrics = JobManagerMetrics()
        self.metrics.collect_with(self._gauges)
        self.committer = MeteredCommitter(log, world, self.id, GROUP, self.logger, self.metrics)
        self.blobs = Blobs(log)
        self.state = LeaderState()
        """Replaced whole when it steps down or takes over: the collaborators ask ``current()``."""
        self.registered: set[str] = set()
        """Every job ever registered (an id stays taken); filled in place at each take-over."""
        self.purged: set[str] = set()
        """Jobs purged (``JobPurged``): their ids stay taken, their keys are gone."""
        self.consumer = GroupConsumer(log, self.inbox, GROUP, self.id, on_dead_letter=self._dead_lettered, sole=True)
        log.on_set_aside = set_aside_reporter(self.logger, self.metrics)
        self.phase = Phase.STANDBY
        self.replay: Replay | None = None
        self.snapshots: SnapshotWriter | None = None
        """The leader's snapshot writer (None while it does not lead)."""
        # The collaborators, each built from what it uses (none sees the JobManager).
        parts = assemble(
            log,
            self.committer,
            world,
            self.logger,
            self.blobs,
            registered=self.registered,
            purged=self.purged,
            settings=Settings(
                config,
                jobs_config,
                storage_root,
                GROUP,
                batch,
                checkpoint_interval_ms,
                coordinator_executor,
                inbox_retention_ms,
                fact_retention,
            ),
            ports=Ports(
                self.current,
                lambda: self.consumer,
                lambda: self.recovering,
                lambda: self.snapshots,
                self._recover_pending,
                lambda: self.replay,
                self._serve_recovered,
                self.lease.progress,
                self._all_recovered,
            ),
        )
        self.job_inboxes, self.archive, self.retention = parts.job_inboxes, parts.archive, parts.retention
        self.disposal, self.cluster, self.restorer = parts.disposal, parts.cluster, parts.restorer
        self.rejoin, self.new_snapshots = parts.rejoin, parts.snapshot_writer
        self.errors: list[BaseException] = []
        """Unexpected errors survived (each a bug; the simulation fails a seed on one)."""
        self._next_acquire = 0
        self.unreadables = UnreadableWatch(log, self.logger, world.monotonic)
        """A fact of the log this JobManager could not read (it handed the lease over), and
        when it looks again."""
        self.server_watch = ServerWatch(self.tag)
        self._next_tick = 0
        self.timeout_gate = TimeoutGate(config.heartbeat_timeout_ms, batch, self.logger)
        self._announced = False

    def current(self) -> LeaderState:
        """The leader's state as it is now (it is replaced whole at a step down and a take-over)."""
        return self.state

    def _gauges(self) -> list[Metric]:
        state = self.state  # replaced whole when it steps down: read once
        return jobmanager_gauges(
            leading=self.leading,
            epoch=self.epoch,
            state=state,
            recovering=len(self.recovering),
            streams=list(self.consumer.streams),
            cluster=(self.inbox, self.tag),
            log=self.log,
            group=self.group,
            logger=self.logger,
        )

    @property
    def unreadable(self) -> Unreadable | None:
        """The fact of the log this JobManager could not read (None: none met)."""
        return self.unreadables.current

    @property
    def timeouts_while_behind(self) -> bool:
        """Heartbeat timeouts are decided though the cluster inbox has not been read to its end
        (it has stayed behind for longer than the timeout): a live TaskManager may be lost."""
        return self.timeout_gate.while_behind

    @property
    def epoch(self) -> int | None:
        return self.committer.epoch if self.phase is not Phase.STANDBY else None

    @property
    def leading(self) -> bool:
        return self.phase is Phase.LEADING

    # --- the steps -----------------------------------------------------------------------

    def step(self, *, block_ms: int | None = 0) -> bool:
        """One pass of the main loop; whether it did anything. Never raises for anything
        the cluster does (a deposed leader steps down, a restarted server or a bug makes it
        rebuild from the log) except RedisUnavailable, after which the caller waits."""
        try:
            return self._step(block_ms)
        except (StaleEpoch, StoreRestarted, DuplicateCommit) as exc:
            said, key = _REBUILDS[type(exc)]
            self.logger.warning(said, **{key: str(exc)})
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
        if self.phase is Phase.STANDBY or self.lease.lost:
            return False
        why = self.lease.renew()
        if why is not None:
            self.logger.warning("lost the lease, stepping down", epoch=self.committer.epoch, why=why)
        return True

    def _step(self, block_ms: int | None) -> bool:
        self.lease.progress()
        if self.phase is not Phase.STANDBY and self.lease.lost:
            self.step_down()
            return True
        if self.phase is Phase.STANDBY:
            return self._try_lead()
        if self.phase is Phase.REPLAYING:
            assert self.replay is not None
            self.replay.step()
            if self.replay.ready():
                with gc_paused():  # restoring coordinators folds their tails: as much work as a page
                    self._take_over()
            return True
        if self.replay is not None:  # serving while the jobs left are rebuilt, a page per step
            self.rejoin.step()
        read_at = monotonic_ms(self.world)  # the view is at least this fresh (the call may stall after its read)
        read = read_batch(self.consumer, self.inbox, self.batch, block_ms, self.linger_ms, self.logger)
        entries, caught_up = read.entries, read.caught_up
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
            self.server_watch.check(self.log.server_id(), self.committer.server)  # (redis-py reconnects silently)
            # (the clock read again: the check may have stalled, and the view must be fresh after it)
            self.tick(
                self.world.now_ms(), caught_up=self.timeout_gate.ready(monotonic_ms(self.world), caught_up, read_at)
            )
            self._next_tick = clock + min(self.config.heartbeat_interval_ms, 200)
        return bool(entries)

    def _try_lead(self) -> bool:
        if not self.unreadables.may_lead():
            return False
        clock = monotonic_ms(self.world)
        if clock < self._next_acquire:
            return False
        self._next_acquire = clock + max(self.lease.ttl_ms // 4, 1)
        server = self.log.server_id()
        self.server_watch.seen(server)
        epoch = self.lease.try_acquire(server)
        if epoch is None:
            if not self._announced:
                holder = self.lease.lease.current()
                self.logger.info(
                    "standby", leader=holder.holder if holder else None, epoch=holder.epoch if holder else None
                )
                self._announced = True
            return False
        self._announced = False
        self.rejoin.took_lease = self.world.monotonic()
        self.committer.begin(epoch, server)
        self.phase = Phase.REPLAYING
        self.replay = Replay(
            self.log,
            self.committer.fence,
            page=self.replay_page,
            logger=self.logger,
            monotonic=self.world.monotonic,
            serve_after_s=self.serve_after_s,
            freeze_gc=self.freeze_gc,
            reconcile=lambda r: reconcile(self.log, r, server, self.server_watch.saw_restart),
        )
        self.logger.info("replaying the log", epoch=epoch)
        return True

    def _cannot_read(self, exc: DecodeError) -> None:
        """A fact of the log this JobManager cannot read (services/jobmanager/unreadable.py):
        stop, hand the lease over at once (not committed with, when met before serving), and
        wait, longer each time, before looking again. Said once per entry."""
        served = self.phase is Phase.LEADING
        epoch = self.committer.epoch
        self.step_down()
        try:
            self.lease.release()
        except RedisUnavailable:
            pass  # it lapses
        self.metrics.log_unreadable.labels(exc.kind).inc()
        self.unreadables.met(exc, self.lease.ttl_ms / 1000, epoch=epoch, served=served)

    def step_down(self) -> None:
        """Stop leading and forget the state (it is rebuilt from the log when leading again)."""
        if self.phase is not Phase.STANDBY:
            self.job_inboxes.close_coordinators()
        if self.replay is not None and self.freeze_gc:  # abandoned midway: what it froze (gc.freeze) is garbage now
            gc.unfreeze()
        self.phase = Phase.STANDBY
        self.replay = None
        self.committer.end()
        self.committer.on_facts = None
        self.state = LeaderState()
        self.snapshots = None
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
        is folded (``Rejoin``); until then their inboxes wait unread, and no task is
        scheduled (the slots they hold are not known yet)."""
        assert self.replay is not None
        r = self.replay.result
        epoch, server = self.committer.epoch, self.committer.server
        assert epoch is not None
        now = self.world.now_ms()
        self.state = LeaderState(r.membership, r.jobs)
        r.jobs.epoch = epoch  # what the cores fold as they decide carries it, as the committed facts do
        self.registered.clear()  # (in place: the collaborators hold these sets)
        self.registered.update(r.registered)
        self.purged.clear()
        self.purged.update(r.purged)
        self.retention.reset()
        self.consumer = GroupConsumer(
            self.log, self.inbox, GROUP, self.id, on_dead_letter=self._dead_lettered, sole=True
        )
        rebuilt = self.replay.take_rebuilt()
        restoring = [(job_id, self.restorer.restore_coordinators(job_id, r)) for job_id in rebuilt]
        granted, facts, consequences = announce(
            LeadershipGranted(epoch, self.id, hostname(), server),
            r.last_grant,
            self.server_watch.saw_restart,
            self.log.backend,
            self.state.membership,
            self.logger,
            self.keys,
        )
        if r.found:  # registrations the cluster's shard lost, told by the jobs' own facts
            self.logger.warning("jobs registered again", jobs=sorted(r.found))
            facts = [*facts, *(JobRegistered(j, name) for j, name in r.found.items())]
        if facts:  # (a lost TaskManager's tasks are failed below, once the coordinators run)
            self.committer.rewind = rewinds(facts, server)
            self.cluster.commit_facts(facts, consequences=consequences)
        for job_id, coords in restoring:
            self.restorer.start_coordinators(job_id, coords, r, now)
        self.restorer.renumber(now)
        self.state.monitor.restart(self.state.membership, monotonic_ms(self.world))
        # Deadlines of what the log has pending count from here at the earliest (services/jobs/timers.py).
        self.state.reports.leading_since = self.state.timers.started = monotonic_ms(self.world)
        for tag in [self.tag] + [self.keys.job(j) for j in rebuilt]:
            self.committer.deliver(tag)
        self.consumer.ensure_group()
        self.server_watch.announced()
        self.snapshots = self.new_snapshots(r, granted)
        self.committer.on_facts = self.snapshots.committed
        for job_id in rebuilt:
            r.tails.pop(job_id, None)  # fed to the coordinators, and copied into the snapshot writer
        self.phase = Phase.LEADING
        recovering = len(self.replay.pending)
        if not recovering:
            self.replay = None
        self.logger.info(
            "leading",
            epoch=epoch,
            replayed=r.facts,
            from_snapshots=r.from_snapshots,
            archived=len(r.archived),
            taskmanagers=len(self.state.membership.active()),
            jobs=len(self.state.jobs.jobs),
            recovering=recovering,
        )
        # Messages a previous leader read but never committed: ours now (each once).
        self.handle_batch(self.consumer.recover())
        self.restorer.orphans(now)
        self.job_inboxes.schedule_all()
        self.metrics.recovery.observe(self.world.monotonic() - self.rejoin.took_lease)

    # --- jobs rebuilt while leading ----------------------------------------------------------

    @property
    def recovering(self) -> list[str]:
        """Live jobs this leader is still rebuilding from the log (it serves meanwhile)."""
        replay = self.replay  # read once: the metrics endpoint asks from its own thread
        return list(replay.pending) if replay is not None and self.leading else []

    def _recover_pending(self, job_id: str) -> None:
        """A live job still being recovered, rebuilt at once (an archived job is asked about)."""
        if self.replay is not None and self.leading and self.replay.recovering(job_id):
            self.rejoin.now(job_id)

    def _all_recovered(self, seconds: float) -> None:
        self.metrics.all_recovered.observe(seconds)
        self.replay = None  # (waits for slots count from here at the earliest: services/jobs/timers.py)
        self.job_inboxes.schedule_all()

    def _serve_recovered(self, job_id: str) -> None:
        """Messages a previous leader read from a job's inbox but never committed: ours now."""
        if self.job_inboxes.following(job_id):
            self.handle_batch(self.consumer.recover(streams=[self.keys.inbox(self.keys.job(job_id))]))

    # --- handling ------------------------------------------------------------------------

    def handle_batch(self, entries: list[Entry]) -> None:
        """Cluster messages one by one; each job's messages decided in order and committed
        together (one group commit per job and batch)."""
        self.metrics.handled_entries([e.envelope for e in entries])
        route(entries, self.inbox, cluster=self.cluster.handle, job=self.job_inboxes.handle, park=self.committer.park)

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
        if self.snapshots is not None:  # ended jobs are archived at once; the rest every interval
            self.snapshots.tick(now)

    def _dead_lettered(self, stream: str, entry_id: str, error: Exception) -> None:
        self.metrics.parked(getattr(error, "kind", "undecodable"))
        self.logger.warning("entry parked in dead letters", stream=stream, entry=entry_id, error=str(error)[:300])

    # --- the real process ----------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Stand by until leading, lead until deposed or stopped; survive Redis outages
        (services/jobmanager/runner.py)."""
        ProcessLoop(
            step=lambda block_ms: self.step(block_ms=block_ms),
            step_lease=self.step_lease,
            ping=self.log.server_id,
            block_ms=lambda: 50 if self.leading and self.replay is None else None,
            standing_by=lambda: self.phase is Phase.STANDBY,
            release=self._release,
            ttl_ms=self.lease.ttl_ms,
            logger=self.logger,
            on_error=self._unexpected,
        ).run(stop)

    def _release(self) -> None:
        """The process ends: a leader hands leadership over (its coordinators closed, the
        outbox cursors moved so the next leader starts where delivery ended)."""
        if self.phase is not Phase.STANDBY:
            self.job_inboxes.close_coordinators()
            try:
                self.committer.flush_cursors()
                self.lease.release()
                self.logger.info("released leadership", epoch=self.committer.epoch)
            except RedisUnavailable:
                pass
