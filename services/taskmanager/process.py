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

import os
import sys
import threading
from collections import OrderedDict, deque
from pathlib import Path
from typing import TYPE_CHECKING

from sluice.errors import PartlyAppended, RedisUnavailable, StorageUnreachable, WrongType
from sluice.events import (
    FIELD,
    AcknowledgeRegistration,
    AlreadyRegistered,
    AttemptReport,
    CancelTask,
    DisconnectTaskManager,
    Envelope,
    Event,
    ScheduleOrUpdateConsumers,
    SubmitTask,
    TaskOperationResult,
    TaskState,
    TaskStatesRecorded,
    UnregisterTaskManager,
    UpdateTaskExecutionState,
    descriptor_to_json,
    encode,
)
from sluice.services.common.gauges import taskmanager_gauges
from sluice.services.common.metrics import TaskManagerMetrics
from sluice.services.common.shell import RedisAway, get_logger, hostname, set_aside_reporter
from sluice.services.common.world import SYSTEM, World, monotonic_ms
from sluice.store import Blobs, EventLog, GroupConsumer, LeaseHolder, current_leader
from sluice.store.consumer import Entry, dead_letter

from .core import Registration, RegistrationConfig, Tick, decide
from .library import LibraryCache
from .reach import Reach
from .root_watch import RootWatch
from .share import local_cores, task_partitions
from .slots import ProcessSlots, Slots
from .tasks import Task, TaskStartFailed, TaskTable, release, standard_steps, start
from .tempdirs import TempDir

if TYPE_CHECKING:
    from sluice.services.embedded.spark_connect import SparkConnectServer

__all__ = ["TaskManager", "GROUP"]

GROUP = "taskmanager"
REFUSED_FOR_MS = 30_000
"""How long a report whose inbox refuses it stays owed before it is parked, in milliseconds
(an inbox whose key holds another kind of value is moved aside at once: refused, the key
was written again)."""
_REMEMBERED = 10_000  # inbox entries remembered as handled, and final states kept unconfirmed
_REPORTED_ERROR = 2_000  # characters of a failure kept in the slot report
_LOOK_EVERY_MS = 50
"""While messages keep coming, how often a TaskManager asks who leads and whether Redis
restarted (two round trips); a step that read nothing asks every time."""


class TaskManager:
    def __init__(self, log: EventLog, *, resource_id: str | None = None, slots: int = 1,
                 host: str | None = None, config: RegistrationConfig = RegistrationConfig(),
                 labels: dict[str, str] | None = None, inbox_retention_ms: int = 600_000,
                 home: Path = Path(".sluice"), redis_url: str | None = None, execute: bool = True,
                 spark_remote: str | None = None, io_rate: float = 0.0, world: World = SYSTEM,
                 runner: Slots | None = None, task_partitions: int | None = None,
                 spark_cores: int | None = None, spark_slots: int | None = None) -> None:
        self.log, self.keys, self.world = log, log.keys, world
        self.spark_remote = spark_remote
        self.io_rate = io_rate
        self.task_partitions = task_partitions
        """Spark partitions every task gets (``share.py``); 0: what Spark decides; None: each
        task's share of its server's cores (below)."""
        self.spark_cores = spark_cores
        """The cores of the Spark server given as ``spark_remote`` (None: unknown, unless this
        TaskManager starts its own local one)."""
        self.spark_slots = spark_slots
        """How many slots share the server (None: this TaskManager's)."""
        self._spark_server: SparkConnectServer | None = None
        self.inbox_retention_ms = inbox_retention_ms
        self._next_trim = 0
        self._next_sweep = 0
        self._next_look = 0
        self._leader: LeaseHolder | None = None
        host = host if host is not None else hostname()
        self.resource_id = resource_id or f"tm-{host}-{world.new_id()[:8]}"
        self.reg = Registration(self.resource_id, world.new_id(), host, slots, config, labels or {},
                                reporter=self.slot_report)
        self.inbox = self.keys.inbox(self.keys.taskmanager(self.resource_id))
        self.cluster_inbox = self.keys.inbox(self.keys.cluster)
        self.logger = get_logger("taskmanager", tm=self.resource_id)
        self.metrics = TaskManagerMetrics()
        self.metrics.collect_with(lambda: taskmanager_gauges(self))
        self.consumer = GroupConsumer(log, self.inbox, GROUP, self.resource_id, on_dead_letter=self._dead_lettered)
        log.on_set_aside = set_aside_reporter(self.logger, self.metrics)
        self.home = Path(home)
        self.execute = execute
        self.tasks = TaskTable()
        self.library = LibraryCache(Blobs(log), self.home / "cache")
        self.temp = TempDir(self.home / "tmp", self.resource_id)
        self.reach = Reach(self.resource_id, host)
        self.root_watch = RootWatch(self.resource_id, self.logger, inline=world is not SYSTEM)
        """Whether it sees the leader's storage root, told to the leader (which refuses jobs if not)."""
        self.steps = standard_steps(self.library, self.tasks, self.temp.path,
                                    self._launch, self._cancel_launch)
        self.slots: Slots = runner or ProcessSlots(log, self.resource_id, redis_url=redis_url, home=self.home,
                                                   spark_remote=lambda: self.spark_remote)
        self.cancelling: set[str] = set()
        self.owed: deque[tuple[str, Envelope]] = deque()
        """Reports to jobs not yet sent (Redis was away): sent, in order, before anything else."""
        self._refused_since: dict[str, int] = {}
        """Owed reports whose inbox refused them (not a stream), by envelope id: since when."""
        self._exits: deque[tuple[int, str]] = deque()  # workers seen dead, not yet recorded
        self.handled: OrderedDict[str, None] = OrderedDict()
        self.finals: OrderedDict[str, AttemptReport] = OrderedDict()
        """Final states of tasks that ended here, kept (and listed in every slot report)
        until the leader confirms its log has them: a report lost on the way is not lost."""
        self._unsure: dict[str, tuple[str, dict]] = {}
        """Task id -> (handle, runtime) of a hand-over whose reply was lost (it may or may not
        have taken effect): settled by ``_confirm_launches``."""
        self.server: str | None = None
        self._recovering = False
        self._started = False
        self._last_state = self.reg.state

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Begin a session: messages to an earlier session of this resource id are void."""
        self.server = self.log.server_id()
        self.consumer.skip_to_end()
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
                    self._recovering = True
                    stop.wait(backoff)
                    backoff = min(backoff * 2, 5.0)
                    continue
                if self.reg.state == "REFUSED":
                    self.logger.error("registration refused for good", reason=self.reg.refusal)
                    print(f"sluice taskmanager {self.resource_id}: registration refused: {self.reg.refusal}",
                          file=sys.stderr)
                    return 2
            self.leave()
            return 0
        finally:
            self.shutdown()

    def step(self, *, block_ms: int = 0) -> bool:
        """One pass: handle a batch of the inbox, look after the workers, let time pass.
        RedisUnavailable leaves what was read but not acknowledged for the next step."""
        try:
            self._flush()
            if self._unsure:
                self._confirm_launches()
            if self._recovering:
                entries = self.consumer.pending()
                self._recovering = False
            else:
                entries = self.consumer.read(count=100, block_ms=block_ms)
            self.metrics.handled(e.envelope.type for e in entries)
            for entry in entries:
                self._handle(entry)
            if entries:  # one acknowledgement for the batch, sent with the next read: an entry
                # handled but not yet acknowledged when a step fails is read again and skipped
                # (``handled``); a new session of this TaskManager drops what is left pending
                self.consumer.ack_later(*(e.id for e in entries))
            self._supervise()
            self._tick(busy=bool(entries))
        except RedisUnavailable:
            self._recovering = True  # re-handle what was read but not acknowledged
            raise
        if self.reg.state != self._last_state:
            self.logger.info("registration", state=self.reg.state, epoch=self.reg.epoch,
                             why=self.reg.history[-1] if self.reg.history else "a new session")
            self._last_state = self.reg.state
        return bool(entries)

    def _handle(self, entry: Entry) -> None:
        key = entry.envelope.id
        if key not in self.handled:
            msg = entry.envelope.event
            if isinstance(msg, SubmitTask):
                self._submit_task(msg)
            elif isinstance(msg, CancelTask):
                self._cancel_task(msg)
            elif isinstance(msg, UpdateTaskExecutionState):
                self._task_ended(msg)
            elif isinstance(msg, TaskStatesRecorded):
                if msg.session == self.reg.session:
                    for tid in msg.tasks:
                        self.finals.pop(tid, None)
            else:
                # The leader no longer counts our tasks in (it declared us lost, and tells us to
                # register again, or acknowledges a fresh registration): drop them here too.
                if isinstance(msg, DisconnectTaskManager) and msg.session == self.reg.session:
                    self._drop_all_tasks(msg.reason)
                elif isinstance(msg, AcknowledgeRegistration) and msg.session == self.reg.session and self.tasks:
                    self._drop_all_tasks("registered afresh: the leader had declared this TaskManager lost")
                for send in decide(self.reg, msg, monotonic_ms(self.world)).sends:  # (its timeouts: monotonic)
                    self._send(send.event, cause=entry.envelope.id)
                if isinstance(msg, (AcknowledgeRegistration, AlreadyRegistered)) and msg.session == self.reg.session:
                    self.root_watch.expect(msg.session, msg.storage_root, msg.root_id, monotonic_ms(self.world))
            self.handled[key] = None
            if len(self.handled) > _REMEMBERED:
                self.handled.popitem(last=False)

    def _tick(self, *, busy: bool = False) -> None:
        now = monotonic_ms(self.world)  # its schedules (a wall-clock step back would put them off)
        if now >= self._next_trim:
            # What is kept: entry ids (the Redis server's clock) against this host's wall clock,
            # for inspection only; a skew keeps that much more or less, which nothing relies on.
            self.log.trim_consumed(self.inbox, GROUP, keep_ms=self.inbox_retention_ms, now_ms=self.world.now_ms())
            self._next_trim = now + min(self.inbox_retention_ms, 10_000)
        if self.temp.claimed and now >= self._next_sweep:
            self._sweep_temp()
        if not busy or now >= self._next_look:  # a stream of tasks need not ask twice a task
            server = self.log.server_id()
            if self.server is not None and server != self.server:
                self._server_restarted(server)
            self._leader = current_leader(self.log)
            self._next_look = now + _LOOK_EVERY_MS
        leader = self._leader
        free = self.reg.slots - len(self.tasks)
        for send in decide(self.reg, Tick(leader.epoch if leader else None, free), monotonic_ms(self.world)).sends:
            self._send(send.event)
        if self.reg.state == "REGISTERED":  # what it sees of the leader's storage root (looked at off the loop)
            report = self.root_watch.poll(monotonic_ms(self.world), self.reg.session)
            if report is not None and self._send(report):
                self.root_watch.sent()

    def slot_report(self) -> list[AttemptReport]:
        """What this TaskManager holds (DEPLOYING until handed to its worker, then RUNNING)
        and the final states the leader has not confirmed yet."""
        held = [AttemptReport(t.descriptor.job_id, t.descriptor.execution_id,
                              TaskState.RUNNING if t.rq_job else TaskState.DEPLOYING) for t in self.tasks.values()]
        return held + list(self.finals.values())

    def _final(self, task: Task, state: TaskState, error: str | None = None) -> None:
        """Remember a task's final state until the leader confirms it."""
        d = task.descriptor
        if error is not None and len(error) > _REPORTED_ERROR:  # the job's inbox has it whole; heartbeats stay small
            error = error[:_REPORTED_ERROR] + "\n… (truncated)"
        self.finals[task.id] = AttemptReport(d.job_id, d.execution_id, state, error)
        self.metrics.tasks_ended.labels(state._value_).inc()
        while len(self.finals) > _REMEMBERED:
            self.finals.popitem(last=False)

    def _server_restarted(self, server: str) -> None:
        """Redis restarted. If it keeps every acknowledged write, nothing was lost: go on.
        Otherwise what this TaskManager reported lately may be lost, and the leader will run
        every unfinished task again: drop ours, void the inbox, register afresh."""
        self.server = server
        if self.log.backend.durable():
            self.logger.info("the Redis server restarted and lost nothing (appendfsync always)", run_id=server[:8])
            return
        self.logger.warning("the Redis server restarted and may have lost writes; dropping tasks and registering "
                            "again", run_id=server[:8], tasks=len(self.tasks))
        self._drop_all_tasks("the Redis server restarted")
        self.finals.clear()  # the leader runs every unfinished attempt again, renumbered
        self.consumer.skip_to_end()
        self.reg = Registration(self.resource_id, self.world.new_id(), self.reg.host, self.reg.slots,
                                self.reg.config, self.reg.labels, reporter=self.slot_report)
        self._recovering = False

    def leave(self) -> None:
        if self.reg.state != "REGISTERED":
            return
        try:
            sent = self._send(UnregisterTaskManager(self.resource_id, self.reg.session, "stopped gracefully"))
        except RedisUnavailable as exc:
            self.logger.warning("could not say goodbye; the leader will time this TaskManager out", error=str(exc))
            return
        if sent:
            self.logger.info("unregistered", reason="stopped gracefully")
        else:
            self.logger.warning("could not say goodbye (the cluster inbox refused it); the leader will time this "
                                "TaskManager out")

    def _sweep_temp(self) -> None:
        """Remove the temp directories of TaskManagers of this home that died (killed, their
        files left behind): at the start, then every minute."""
        self._next_sweep = monotonic_ms(self.world) + 60_000
        for path in self.temp.sweep():
            self.logger.info("removed the temp files of a TaskManager that is gone", path=str(path))

    def shutdown(self) -> None:
        try:
            self.consumer.flush_acks()  # tidy: a next session would drop them anyway
        except Exception:  # Redis away, or refusing: the workers must stop all the same
            pass
        self.temp.release()
        self.slots.stop()
        if self._spark_server is not None:
            self._spark_server.stop()
            self._spark_server = None

    def _send(self, message: Event, cause: str | None = None) -> bool:
        """A message to the leader; whether it went. One the cluster inbox refuses (its key
        holds another kind of value again right after it was moved aside) is dropped with a
        warning: registration sends again when unanswered, and heartbeats come again."""
        try:
            self.log.append(self.cluster_inbox,
                            Envelope(message, self.world.new_id(), 0, self.world.now_ms(), None, cause))
        except WrongType as exc:
            self.logger.warning("a message to the leader was refused", message=message.TYPE, error=str(exc)[:300])
            return False
        self.metrics.appended((message.TYPE,), "inbox")
        return True

    def _to_job(self, job_id: str, message: Event, *, flush: bool = True) -> None:
        """Report to a job. A report is owed until it is sent: one that fails (Redis away) is
        sent at the next step, before anything else, so none is lost (one may arrive twice:
        the leader ignores a repeated report). ``flush=False``: only queue it (inside a
        step of starting a task, where a Redis error must not fail the start)."""
        self.owed.append((self.keys.inbox(self.keys.job(job_id)),
                          Envelope(message, self.world.new_id(), 0, self.world.now_ms(), job_id)))
        if flush:
            self._flush()

    def _flush(self) -> None:
        """Send every report owed in one round trip (a task's start owes two: the SubmitTask's
        result and INITIALIZING). When the round trip fails they all stay owed and go again,
        some maybe twice: the leader ignores a repeated report.

        An inbox whose key holds another kind of value is moved aside first (EventLog). A
        report refused all the same (the key was written again at once) stays owed and the
        others go. One refused for REFUSED_FOR_MS is parked in its job's dead letters with
        the reason; a final state also travels in every slot report until the leader has it."""
        if not self.owed:
            return
        sent = list(self.owed)
        try:
            self.log.append_each(sent)
            refused: dict[int, str] = {}
        except PartlyAppended as exc:
            refused = exc.errors
        now = monotonic_ms(self.world)  # how long a report has been refused: a timeout, on this process's clock
        kept: deque[tuple[str, Envelope]] = deque()
        parked: list[tuple[str, Envelope, str]] = []
        for i, (stream, env) in enumerate(sent):
            error = refused.get(i)
            if error is None:
                self._refused_since.pop(env.id, None)
                continue
            since = self._refused_since.setdefault(env.id, now)
            if now - since >= REFUSED_FOR_MS:
                parked.append((stream, env, error))
                continue
            if since == now:
                self.logger.warning("a report was refused; it stays owed", stream=stream, report=env.type,
                                    error=error[:300])
            kept.append((stream, env))
        self.owed = kept
        self.metrics.appended((env.type for i, (_, env) in enumerate(sent) if i not in refused), "inbox")
        for n, (stream, env, error) in enumerate(parked):
            try:
                self._park_report(stream, env, error)
            except RedisUnavailable:
                self.owed.extend((s, e) for s, e, _ in parked[n:])
                raise

    def _park_report(self, stream: str, env: Envelope, error: str) -> None:
        self._refused_since.pop(env.id, None)
        reason = (f"undeliverable: {stream!r} refused the report for {REFUSED_FOR_MS // 1000} s ({error}); "
                  "the report stays here")
        try:
            dead_letter(self.log, stream, "", env.id, {FIELD: encode(env)}, "undeliverable", reason)
        except RedisUnavailable:
            raise
        except Exception as again:  # its job's dead letters refuse it too: the log line keeps it
            self.logger.error("a refused report could not be parked; it is dropped", stream=stream,
                              report=encode(env).decode(), error=str(again)[:300])
            return
        self.metrics.parked("undeliverable")
        self.logger.error("a report refused for too long was parked in its job's dead letters", stream=stream,
                          report=env.type, error=error[:300])

    def _dead_lettered(self, stream: str, entry_id: str, error: Exception) -> None:
        self.metrics.parked(getattr(error, "kind", "undecodable"))
        self.logger.warning("entry parked in dead letters", stream=stream, entry=entry_id, error=str(error)[:300])

    # --- tasks ---------------------------------------------------------------------------

    def _submit_task(self, msg: SubmitTask) -> None:
        tid = f"{msg.job_id}/{msg.execution_id}"
        if tid in self.tasks:
            return  # this very attempt runs here already: the SubmitTask came twice
        task = Task(msg.descriptor, msg.slot)
        busy = self.tasks.slot_busy(msg.slot) if 0 <= msg.slot < self.reg.slots else None
        if busy is not None and busy.descriptor.job_id == msg.job_id \
                and (busy.descriptor.vertex, busy.descriptor.subtask) == (msg.vertex_id, msg.subtask) \
                and busy.descriptor.attempt > msg.attempt:
            self.logger.warning("stale SubmitTask ignored: a newer attempt runs in its slot", old=tid, new=busy.id)
            return
        if busy is not None:
            # The leader gave the slot to a new attempt, so it no longer counts the one here
            # (it failed it: this TaskManager was lost, or its report was): that one goes.
            self.logger.warning("slot taken over by a new attempt; dropping the old one", slot=msg.slot,
                                old=busy.id, new=tid)
            self._drop(busy, "its slot was given to another attempt")
        try:
            if not 0 <= msg.slot < self.reg.slots:
                raise TaskStartFailed("slot", ValueError(f"slot {msg.slot} does not exist (this TaskManager has "
                                                         f"{self.reg.slots})"))
            try:
                self.reach.check(task.descriptor)  # once per job: its storage root and inputs are here
            except StorageUnreachable as exc:
                raise TaskStartFailed("storage root", exc) from exc
            start(task, self.steps, on_undo_error=lambda step, exc: self.logger.error(
                "undo failed", step=step, error=str(exc)))
        except TaskStartFailed as exc:
            if isinstance(exc.cause, RedisUnavailable):  # not the task's fault: start it again later
                raise exc.cause from exc
            self.logger.warning("task start failed", task=task.id, step=exc.step, error=str(exc.cause),
                                undone=task.undone)
            self._to_job(msg.job_id, TaskOperationResult(msg.job_id, msg.execution_id, False, str(exc),
                                                         not isinstance(exc.cause, StorageUnreachable)))
            return
        if not self.execute:  # a TaskManager that finishes tasks without running them (benchmarks)
            # Reports are queued first and sent once the bookkeeping is done: a Redis error
            # while sending must not leave the task half-recorded (its reports stay owed).
            # (A worker's launch sent its SubmitTask's result with the hand-over.)
            self._to_job(msg.job_id, TaskOperationResult(msg.job_id, msg.execution_id, True, None), flush=False)
            d = task.descriptor
            self._to_job(msg.job_id, self._state(task, TaskState.RUNNING), flush=False)
            if d.output:
                self._to_job(msg.job_id, ScheduleOrUpdateConsumers(d.job_id, d.execution_id, d.vertex,
                                                                   d.subtask, d.attempt), flush=False)
            self._to_job(msg.job_id, self._state(task, TaskState.FINISHED), flush=False)
            self._final(task, TaskState.FINISHED)
            release(task, self.steps, keep_output=True)
        self._flush()

    def _cancelled(self, msg: CancelTask) -> UpdateTaskExecutionState:
        try:
            vertex, subtask, attempt = msg.execution_id.rsplit(":", 2)
            return UpdateTaskExecutionState(msg.job_id, msg.execution_id, TaskState.CANCELED, None, vertex,
                                            int(subtask), int(attempt), self.resource_id, None)
        except ValueError:
            return UpdateTaskExecutionState(msg.job_id, msg.execution_id, TaskState.CANCELED)

    def _state(self, task: Task, state: TaskState, error: str | None = None) -> UpdateTaskExecutionState:
        d = task.descriptor
        return UpdateTaskExecutionState(d.job_id, d.execution_id, state, error, d.vertex, d.subtask,
                                        d.attempt, self.resource_id, task.slot)

    def _launch(self, task: Task) -> str:
        # The start's two reports, its SubmitTask's result and INITIALIZING, are written with
        # the hand-over to the slot's worker, in one round trip and before it (ProcessSlots:
        # one MULTI/EXEC). An idle worker picks the task up at once and reports RUNNING, which
        # must not overtake INITIALIZING (the leader drops a late INITIALIZING, and the log
        # would skip a state). Launch is the start's last step, so the result can say it
        # succeeded. The leader reads both reports in one batch: one commit, not two.
        # A Redis error before the hand-over fails this step, not the task: the start is
        # undone and tried again (a repeated report is ignored).
        d = task.descriptor
        self._flush()  # reports owed from earlier go first
        if not self.execute:
            self._to_job(d.job_id, self._state(task, TaskState.INITIALIZING))
            return "not-executed"
        runtime: dict = {"host": self.reg.host}  # a no-op task needs nothing more (worker.run_task)
        if d.kind != "noop":
            runtime.update(code_path=str(task.code_path), temp_dir=str(task.temp_dir), io_rate=self.io_rate,
                           spark_remote=self._spark(), partitions=self._partitions(d.parallelism))
        return self._hand_over(task, runtime)

    def _hand_over(self, task: Task, runtime: dict) -> str:
        d = task.descriptor
        inbox = self.keys.inbox(self.keys.job(d.job_id))
        reports = [(inbox, Envelope(message, self.world.new_id(), 0, self.world.now_ms(), d.job_id))
                   for message in (TaskOperationResult(d.job_id, d.execution_id, True, None),
                                   self._state(task, TaskState.INITIALIZING))]
        handle = self.world.new_id()
        try:
            self.slots.launch(task.slot, descriptor_to_json(d), runtime, task_id=task.id, handle=handle,
                              reports=reports)
        except RedisUnavailable as exc:
            # The transaction may have taken effect with only its reply lost. The start
            # stands: undoing it would delete the temp files and output of a task its worker
            # may be running now, and trying again would run it twice. Once Redis answers,
            # ``_confirm_launches`` asks which, and hands it over again only if it was not.
            self._unsure[task.id] = (handle, runtime)
            self.logger.warning("a task's hand-over may not have taken effect; asking once Redis is back",
                                task=task.id, error=str(exc)[:200])
            return handle
        self.metrics.appended((env.type for _, env in reports), "inbox")
        return handle

    def _confirm_launches(self) -> None:
        """Settle the hand-overs whose reply was lost: keep one that took effect, hand the task
        over again if it did not (RedisUnavailable: asked again at the next step)."""
        for tid, (handle, runtime) in list(self._unsure.items()):
            task = self.tasks.get(tid)
            if task is None or task.rq_job != handle:  # dropped or cancelled meanwhile
                del self._unsure[tid]
            elif self.slots.handed_over(handle):
                del self._unsure[tid]
                self.logger.info("a hand-over whose reply was lost had taken effect", task=tid)
            else:
                del self._unsure[tid]
                task.rq_job = self._hand_over(task, runtime)

    def _spark(self) -> str | None:
        """The Spark Connect server this TaskManager's workers use: the given one, or one it
        starts itself the first time a task needs Spark (one JVM shared by all its slots)."""
        if self.spark_remote is None and isinstance(self.slots, ProcessSlots):
            from sluice.services.embedded.spark_connect import SparkConnectServer

            (self.home / "logs").mkdir(parents=True, exist_ok=True)
            self._spark_server = SparkConnectServer(
                master=os.environ.get("SLUICE_SPARK_MASTER", "local[*]"),
                log_file=self.home / "logs" / f"{self.resource_id}-spark-connect.log")
            self.spark_remote = self._spark_server.start(wait=False)
            self.logger.info("started a Spark Connect server for this TaskManager", url=self.spark_remote)
        return self.spark_remote

    def _partitions(self, parallelism: int) -> int | None:
        """The Spark partitions of a task of a vertex of ``parallelism`` subtasks here
        (``share.py``); None: Spark decides."""
        if self.task_partitions is not None:
            return self.task_partitions or None
        cores = self.spark_cores
        if cores is None and self._spark_server is not None:  # its own server
            cores = local_cores(self._spark_server.master)
        if cores is None:
            return None
        return task_partitions(cores, self.spark_slots or self.reg.slots, parallelism)

    def _cancel_launch(self, task: Task) -> None:
        if task.rq_job and self.execute:
            self.slots.cancel_queued(task.rq_job)

    def _task_started(self, task: Task) -> bool:
        return bool(self.execute and task.rq_job and self.slots.started(task.rq_job))

    def _cancel_task(self, msg: CancelTask) -> None:
        tid = f"{msg.job_id}/{msg.execution_id}"
        task = self.tasks.get(tid)
        if task is None:
            # Not here (it ended, failed to start, or ran in an earlier session): whatever
            # it was, it is not running, so the leader may stop waiting for it.
            self._to_job(msg.job_id, self._cancelled(msg))
            return
        self.logger.info("cancelling task", task=tid, reason=msg.reason)
        if self._task_started(task) and self.slots.alive(task.slot):
            self.cancelling.add(tid)
            self.slots.kill(task.slot)  # the supervisor reports CANCELED and starts a new worker
            return
        self._cancel_launch(task)
        self._to_job(msg.job_id, self._state(task, TaskState.CANCELED), flush=False)
        self._final(task, TaskState.CANCELED)
        release(task, self.steps, keep_output=False)
        self._flush()

    def _drop(self, task: Task, why: str) -> None:
        """Stop a task the leader no longer counts (no report: it was failed already). Its
        output stays: it may have finished a moment ago, with its report still on the way,
        and then consumers read it (the leader decides which attempt's output counts)."""
        self.logger.warning("dropping task", task=task.id, why=why)
        self._cancel_launch(task)
        if self._task_started(task):
            if self.slots.alive(task.slot):
                self.slots.kill(task.slot, wait=True)
            self._sweep_sink(task)
        self.cancelling.discard(task.id)
        release(task, self.steps, keep_output=True)

    def _sweep_sink(self, task: Task) -> None:
        """The task's worker is dead. If it was a stale attempt of a sink subtask, it may have
        died halfway through publishing, after the newer attempt had cleaned up: its files
        would stay in the sink for good. Delete every file of the subtask's attempts older
        than its newest published one (always safe: those attempts never count)."""
        sink = task.descriptor.sink
        if sink is None:
            return
        try:
            self.slots.sweep_sink(sink.path, task.descriptor.subtask)
        except Exception as exc:  # the storage is away: the newer attempt's own clean-up remains
            self.logger.warning("could not clean the sink after a killed attempt", task=task.id, sink=sink.path,
                                error=f"{type(exc).__name__}: {exc}"[:300])

    def _drop_all_tasks(self, why: str) -> None:
        """The leader no longer counts this TaskManager in: its tasks were failed (and maybe
        restarted elsewhere), so stop them here and free their slots before registering again."""
        for task in list(self.tasks.values()):
            self._drop(task, why)

    def _task_ended(self, msg: UpdateTaskExecutionState) -> None:
        task = self.tasks.get(f"{msg.job_id}/{msg.execution_id}")
        if task is not None and msg.state.terminal:
            if msg.taskmanager == self.resource_id:  # its worker's report (not the leader's release)
                self._final(task, msg.state, msg.error)
            release(task, self.steps, keep_output=msg.state == TaskState.FINISHED)

    # --- workers -------------------------------------------------------------------------

    def _supervise(self) -> None:
        """Record the workers that died. Each exit is seen once, so it is kept until it is
        recorded (its report queued, its slot freed), and reports are sent only after: a Redis
        error on the way must not lose an exit (its slot would stay busy, its task unreported)."""
        self._exits.extend(self.slots.exited())
        while self._exits:
            slot, how = self._exits[0]
            task = self.tasks.slot_busy(slot)
            if task is None:
                self.logger.warning("worker died", slot=slot, how=how)
                self._exits.popleft()
                continue
            self._cancel_launch(task)  # still queued? the replacement worker must not run it
            self._sweep_sink(task)
            cancelled = task.id in self.cancelling
            if cancelled:
                self.cancelling.discard(task.id)
                self._to_job(task.descriptor.job_id, self._state(task, TaskState.CANCELED), flush=False)
                self._final(task, TaskState.CANCELED)
            else:
                self.logger.warning("worker died mid-task", slot=slot, task=task.id, how=how)
                error = f"the worker process of slot {slot} died ({how}) while running the task"
                self._to_job(task.descriptor.job_id, self._state(task, TaskState.FAILED, error), flush=False)
                self._final(task, TaskState.FAILED, error)
            # Its output stays unless the leader had cancelled it: the worker may have died right
            # after reporting FINISHED to the job (its copy to this TaskManager lost with it), and
            # then consumers read that partition (the leader decides which attempt counts).
            release(task, self.steps, keep_output=not cancelled)
            self._exits.popleft()
        self._flush()
