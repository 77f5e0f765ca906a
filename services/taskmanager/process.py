"""The TaskManager: registration and heartbeats, tasks started step by step, one worker
per slot, and a graceful goodbye.

``step()`` is one pass of its loop: read a batch of its inbox and act on each message
once, look after its workers, and let time pass for registration and heartbeats. The
real process calls it in a loop (``run``); the simulation calls the same step. Where its
tasks run is behind ``Slots`` (worker processes fed through RQ, or the simulation's).

Each inbox entry is handled once: a SubmitTask read again (after a Redis error while
acknowledging it) finds its attempt already here and changes nothing. When the Redis
server restarts (its run id changes), this TaskManager cannot know which of its last
reports survived: it drops its tasks, skips what its inbox held before, and registers
again as a new session; the leader restarts what ran here.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from sluice.errors import RedisUnavailable
from sluice.events import (
    AcknowledgeRegistration,
    AlreadyRegistered,
    AttemptReport,
    CancelTask,
    DisconnectTaskManager,
    SubmitTask,
    TaskStatesRecorded,
    UnregisterTaskManager,
    UpdateTaskExecutionState,
)
from sluice.services.common.gauges import taskmanager_gauges
from sluice.services.common.metrics import TaskManagerMetrics
from sluice.services.common.shell import RedisAway, get_logger, hostname, set_aside_reporter
from sluice.services.common.world import SYSTEM, World, monotonic_ms
from sluice.store import Blobs, EventLog, LeaseHolder, current_leader
from sluice.store.consumer import Entry
from sluice.store.shards import Slots as SlotRanges
from sluice.store.shards import failed_slots, in_slots, keeps_every_write, keyslot, sharded

from .core import Registration, RegistrationConfig, Tick, decide
from .inbox import GROUP, Inbox
from .launches import Launches
from .library import LibraryCache
from .pool import SlotPool
from .reach import Reach
from .reports import FinalStates, JobReports, LeaderMessages
from .root_watch import RootWatch
from .slots import ProcessSlots, Slots
from .spark import SparkShare
from .tasks import TaskTable, standard_steps
from .tempdirs import TempDir

__all__ = ["TaskManager", "GROUP"]

_LOOK_EVERY_MS = 50
"""While messages keep coming, how often a TaskManager asks who leads and whether Redis
restarted (two round trips); a step that read nothing asks every time."""


class TaskManager:
    """The shell: wires its collaborators (the inbox, the slot pool, the launches, the
    reports) and runs the loop; each collaborator is built from what it uses."""

    def __init__(
        self,
        log: EventLog,
        *,
        resource_id: str | None = None,
        slots: int = 1,
        host: str | None = None,
        config: RegistrationConfig = RegistrationConfig(),
        labels: dict[str, str] | None = None,
        inbox_retention_ms: int = 600_000,
        home: Path = Path(".sluice"),
        redis_url: str | None = None,
        rq_redis_url: str | None = None,
        execute: bool = True,
        spark_remote: str | None = None,
        io_rate: float = 0.0,
        world: World = SYSTEM,
        runner: Slots | None = None,
        task_partitions: int | None = None,
        spark_cores: int | None = None,
        spark_slots: int | None = None,
    ) -> None:
        self.log, self.world = log, world
        host = host if host is not None else hostname()
        self.resource_id = resource_id or f"tm-{host}-{world.new_id()[:8]}"
        self.reg = Registration(
            self.resource_id, world.new_id(), host, slots, config, labels or {}, reporter=self.slot_report
        )
        self.logger = get_logger("taskmanager", tm=self.resource_id)
        self.metrics = TaskManagerMetrics()
        self.metrics.collect_with(
            lambda: taskmanager_gauges(
                self.log,
                self.inbox.stream,
                GROUP,
                self.logger,
                registered=self.reg.state == "REGISTERED",
                slots=self.reg.slots,
                held=self.slot_report(),
            )
        )
        self.inbox = Inbox(
            log, world, self.resource_id, retention_ms=inbox_retention_ms, logger=self.logger, metrics=self.metrics
        )
        log.on_set_aside = set_aside_reporter(self.logger, self.metrics)
        self.home = Path(home)
        self.execute = execute
        self.tasks = TaskTable()
        """The tasks its slots hold, by id."""
        self.library = LibraryCache(Blobs(log), self.home / "cache")
        self.temp = TempDir(self.home / "tmp", self.resource_id)
        self._next_sweep = 0
        self.reach = Reach(self.resource_id, host)
        self.root_watch = RootWatch(self.resource_id, self.logger, inline=world is not SYSTEM)
        """Whether it sees the leader's storage root, told to the leader (which refuses jobs if not)."""
        self.slots: Slots = runner or ProcessSlots(
            log,
            self.resource_id,
            redis_url=redis_url,
            home=self.home,
            spark_remote=lambda: self.spark.remote,
            rq_redis_url=rq_redis_url,
        )
        """Its workers, one per slot."""
        self.spark: SparkShare = SparkShare(
            remote=spark_remote,
            task_partitions=task_partitions,
            cores=spark_cores,
            shared_by=spark_slots,
            slots=slots,
            may_start=isinstance(self.slots, ProcessSlots),
            logs=self.home / "logs",
            resource_id=self.resource_id,
            logger=self.logger,
        )
        self.reports = JobReports(log, world, self.logger, self.metrics)
        self.to_leader = LeaderMessages(log, world, self.logger, self.metrics)
        self.finals = FinalStates(lambda state: self.metrics.tasks_ended.labels(state._value_).inc())
        self.launches = Launches(
            log,
            world,
            workers=self.slots,
            tasks=self.tasks,
            reports=self.reports,
            spark=self.spark,
            resource_id=self.resource_id,
            host=host,
            io_rate=io_rate,
            execute=execute,
            logger=self.logger,
            metrics=self.metrics,
        )
        self.pool = SlotPool(
            size=slots,
            tasks=self.tasks,
            workers=self.slots,
            steps=standard_steps(self.library, self.tasks, self.temp.path, self.launches.launch, self.launches.cancel),
            launches=self.launches,
            reports=self.reports,
            finals=self.finals,
            reach=self.reach,
            resource_id=self.resource_id,
            execute=execute,
            logger=self.logger,
        )
        self.server: str | None = None
        """The Redis server's run id as last seen (a new one: it restarted)."""
        self._leader: LeaseHolder | None = None
        self._next_look = 0
        self._started = False
        self._last_state = self.reg.state

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Begin a session: messages to an earlier session of this resource id are void."""
        self.server = self.log.server_id()
        self.inbox.skip()
        self.logger.info("starting", slots=self.reg.slots, session=self.reg.session, host=self.reg.host)
        if self.execute and not self._started:
            if isinstance(self.slots, ProcessSlots):  # real worker processes: temp files on this host
                try:
                    self.temp.claim()
                    self._sweep_temp()
                except (OSError, RuntimeError) as exc:  # the tasks' own temp step says what is wrong
                    self.logger.warning("temp files of dead TaskManagers will not be swept", error=str(exc)[:300])
            self.slots.start(self.reg.slots)
        self._started = True

    def run(self, stop: threading.Event) -> int:
        """Serve until stopped (0) or refused for good (2)."""
        away = RedisAway(self.logger)
        backoff = 0.1
        try:
            while not stop.is_set():
                try:
                    if not self._started:
                        self.start()
                    self.step(block_ms=50)
                    away.back()
                    backoff = 0.1
                except RedisUnavailable as exc:  # tasks keep running; reports owed are kept
                    stop.wait(away.away(exc))
                    continue
                except Exception as exc:  # a bug: say where, and go on with what is pending
                    self.logger.exception("unexpected error in the TaskManager's loop", error=str(exc)[:300])
                    self.inbox.recover()
                    stop.wait(backoff)
                    backoff = min(backoff * 2, 5.0)
                    continue
                if self.reg.state == "REFUSED":
                    self.logger.error("registration refused for good", reason=self.reg.refusal)
                    print(
                        f"sluice taskmanager {self.resource_id}: registration refused: {self.reg.refusal}",
                        file=sys.stderr,
                    )
                    return 2
            self.leave()
            return 0
        finally:
            self.shutdown()

    def step(self, *, block_ms: int | None = 0) -> bool:
        """One pass: handle a batch of the inbox, look after the workers, let time pass.
        RedisUnavailable leaves what was read but not acknowledged for the next step."""
        try:
            self.reports.flush()
            if self.launches.unsure:
                self.launches.confirm()
            entries = self.inbox.read(block_ms)
            for entry in entries:
                if self.inbox.is_new(entry):
                    self._handle(entry)
                    self.inbox.done(entry)
            self.inbox.ack(entries)
            self.pool.supervise()
            self._tick(busy=bool(entries))
        except RedisUnavailable:
            self.inbox.recover()  # re-handle what was read but not acknowledged
            raise
        if self.reg.state != self._last_state:
            self.logger.info(
                "registration",
                state=self.reg.state,
                epoch=self.reg.epoch,
                why=self.reg.history[-1] if self.reg.history else "a new session",
            )
            self._last_state = self.reg.state
        return bool(entries)

    def _handle(self, entry: Entry) -> None:
        msg = entry.envelope.event
        if isinstance(msg, SubmitTask):
            self.pool.submit(msg)
        elif isinstance(msg, CancelTask):
            self.pool.cancel(msg)
        elif isinstance(msg, UpdateTaskExecutionState):
            self.pool.ended(msg)
        elif isinstance(msg, TaskStatesRecorded):
            if msg.session == self.reg.session:
                self.finals.confirmed(msg.tasks)
        else:
            # The leader no longer counts our tasks in (it declared us lost, and tells us to
            # register again, or acknowledges a fresh registration): drop them here too.
            if isinstance(msg, DisconnectTaskManager) and msg.session == self.reg.session:
                self.pool.drop_all(msg.reason)
            elif isinstance(msg, AcknowledgeRegistration) and msg.session == self.reg.session and self.tasks:
                self.pool.drop_all("registered afresh: the leader had declared this TaskManager lost")
            for send in decide(self.reg, msg, monotonic_ms(self.world)).sends:  # (its timeouts: monotonic)
                self.to_leader.send(send.event, cause=entry.envelope.id)
            if isinstance(msg, (AcknowledgeRegistration, AlreadyRegistered)) and msg.session == self.reg.session:
                self.root_watch.expect(msg.session, msg.storage_root, msg.root_id, monotonic_ms(self.world))

    def _tick(self, *, busy: bool = False) -> None:
        now = monotonic_ms(self.world)  # its schedules (a wall-clock step back would put them off)
        self.inbox.trim(now)
        if self.temp.claimed and now >= self._next_sweep:
            self._sweep_temp()
        if not busy or now >= self._next_look:  # a stream of tasks need not ask twice a task
            server = self.log.server_id()
            if self.server is not None and server != self.server:
                self._server_restarted(server)
            self._leader = current_leader(self.log)
            self._next_look = now + _LOOK_EVERY_MS
        leader = self._leader
        for send in decide(
            self.reg, Tick(leader.epoch if leader else None, self.pool.free()), monotonic_ms(self.world)
        ).sends:
            self.to_leader.send(send.event)
        if self.reg.state == "REGISTERED":  # what it sees of the leader's storage root (looked at off the loop)
            report = self.root_watch.poll(monotonic_ms(self.world), self.reg.session)
            if report is not None and self.to_leader.send(report):
                self.root_watch.sent()

    def slot_report(self) -> list[AttemptReport]:
        """What this TaskManager holds (DEPLOYING until handed to its worker, then RUNNING)
        and the final states the leader has not confirmed yet."""
        return self.pool.held() + self.finals.reports()

    def _server_restarted(self, server: str) -> None:
        """Redis restarted (or, on a cluster, a shard failed over). If it keeps every acknowledged
        write (one Redis, appendfsync always), nothing was lost: go on.
        Otherwise what this TaskManager reported lately may be lost, and the leader will run
        every unfinished task again: drop ours, void the inbox, register afresh."""
        before, self.server = self.server, server
        if keeps_every_write(self.log.backend.durable(), server):  # (never on a cluster: a failover may lose)
            self.logger.info("the Redis server restarted and lost nothing (appendfsync always)", run_id=server[:8])
            return
        failed = failed_slots(before, server) if before is not None and sharded(server) else None
        if failed is not None and not self._registration_lost(failed):
            self._shards_failed_over(failed)
            return
        self.logger.warning(
            "the Redis server restarted and may have lost writes; dropping tasks and registering again",
            run_id=server[:8],
            tasks=len(self.tasks),
        )
        self.pool.drop_all("the Redis server restarted")
        self.finals.clear()  # the leader runs every unfinished attempt again, renumbered
        self.inbox.skip()
        self.reg = Registration(
            self.resource_id,
            self.world.new_id(),
            self.reg.host,
            self.reg.slots,
            self.reg.config,
            self.reg.labels,
            reporter=self.slot_report,
        )
        self.inbox.recovering = False

    def _registration_lost(self, failed: SlotRanges) -> bool:
        """Whether a failover of the slots ``failed`` may have lost this TaskManager's
        registration or what it was sent: the cluster's tag (registrations, reports on their
        way) or its own tag (its inbox) is there. The leader declares it lost then
        (services/jobmanager/restarts.py), and it registers again."""
        keys = self.log.keys
        return any(in_slots(keyslot(tag), failed) for tag in (keys.cluster, keys.taskmanager(self.resource_id)))

    def _shards_failed_over(self, failed: SlotRanges) -> None:
        """Shards of the cluster's log failed over that hold neither the cluster's tag nor this
        TaskManager's: it stays registered, and drops only the tasks of the jobs whose tag is
        on them (the leader runs their unfinished attempts again, renumbered); the other
        jobs' tasks run on."""
        keys = self.log.keys
        jobs = {t.descriptor.job_id for t in self.tasks.values()} | {r.job_id for r in self.finals.reports()}
        hit = {job_id for job_id in jobs if in_slots(keyslot(keys.job(job_id)), failed)}
        self.logger.warning(
            "a shard of the Redis Cluster failed over and may have lost writes; dropping the tasks of its jobs",
            slots=", ".join(f"{a}-{b}" for a, b in failed),
            jobs=sorted(hit),
        )
        for task in [t for t in self.tasks.values() if t.descriptor.job_id in hit]:
            self.pool.drop(task, "the shard of its job's log failed over")
        self.finals.forget_jobs(hit)

    def leave(self) -> None:
        if self.reg.state != "REGISTERED":
            return
        try:
            sent = self.to_leader.send(UnregisterTaskManager(self.resource_id, self.reg.session, "stopped gracefully"))
        except RedisUnavailable as exc:
            self.logger.warning("could not say goodbye; the leader will time this TaskManager out", error=str(exc))
            return
        if sent:
            self.logger.info("unregistered", reason="stopped gracefully")
        else:
            self.logger.warning(
                "could not say goodbye (the cluster inbox refused it); the leader will time this TaskManager out"
            )

    def _sweep_temp(self) -> None:
        """Remove the temp directories of TaskManagers of this home that died (killed, their
        files left behind): at the start, then every minute."""
        self._next_sweep = monotonic_ms(self.world) + 60_000
        for path in self.temp.sweep():
            self.logger.info("removed the temp files of a TaskManager that is gone", path=str(path))

    def shutdown(self) -> None:
        self.inbox.close()
        self.temp.release()
        self.slots.stop()
        self.spark.stop()
