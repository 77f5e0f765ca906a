"""The TaskManager shell: registration and heartbeats, tasks started step by step, one RQ
worker process per slot (supervised: a worker that dies fails its task, and is replaced),
and a graceful goodbye."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from sluice.errors import RedisUnavailable
from sluice.events import (
    AcknowledgeRegistration,
    CancelTask,
    DisconnectTaskManager,
    Envelope,
    Event,
    SubmitTask,
    TaskOperationResult,
    TaskState,
    UnregisterTaskManager,
    UpdateTaskExecutionState,
)
from sluice.services.common.guard import guarded
from sluice.services.common.shell import get_logger, hostname, new_id, now_ms
from sluice.store import Blobs, EventLog, GroupConsumer, current_leader
from sluice.store.slots import SlotQueues

from .core import Registration, RegistrationConfig
from .library import LibraryCache
from .tasks import Task, TaskStartFailed, TaskTable, release, standard_steps, start
from .worker import RUN_TASK

__all__ = ["TaskManager"]

GROUP = "taskmanager"


class TaskManager:
    def __init__(self, log: EventLog, *, resource_id: str | None = None, slots: int = 1,
                 host: str | None = None, config: RegistrationConfig = RegistrationConfig(),
                 labels: dict[str, str] | None = None, inbox_retention_ms: int = 600_000,
                 home: Path = Path(".sluice"), redis_url: str | None = None, execute: bool = True,
                 spark_remote: str | None = None, io_rate: float = 0.0) -> None:
        self.spark_remote = spark_remote
        self.io_rate = io_rate
        self._spark_server = None
        self.log = log
        self.keys = log.keys
        self.inbox_retention_ms = inbox_retention_ms
        self._next_trim = 0
        host = host if host is not None else hostname()
        self.resource_id = resource_id or f"tm-{host}-{new_id()[:8]}"
        self.reg = Registration(self.resource_id, new_id(), host, slots, config, labels or {})
        self.inbox = self.keys.inbox(self.keys.taskmanager(self.resource_id))
        self.cluster_inbox = self.keys.inbox(self.keys.cluster)
        self.logger = get_logger("taskmanager", tm=self.resource_id)
        self.consumer = GroupConsumer(log, self.inbox, GROUP, self.resource_id, on_dead_letter=self._dead_lettered)
        self.home = Path(home)
        self.redis_url = redis_url
        self.execute = execute
        self.tasks = TaskTable()
        self.library = LibraryCache(Blobs(log), self.home / "cache")
        self.steps = standard_steps(self.library, self.tasks, self.home / "tmp" / self.resource_id,
                                    self._launch, self._cancel_launch)
        self.workers: dict[int, subprocess.Popen] = {}
        self.cancelling: set[str] = set()
        self._recovering = False
        self.queues = SlotQueues(log, self.resource_id)

    # --- lifecycle -----------------------------------------------------------------------

    def run(self, stop: threading.Event) -> int:
        """Serve until stopped (0) or refused for good (2)."""
        self._skip_old_messages()
        self.logger.info("starting", slots=self.reg.slots, session=self.reg.session, host=self.reg.host)
        if self.execute:
            for slot in range(self.reg.slots):
                self._spawn_worker(slot)
        last_state = self.reg.state
        backoff = 0.1
        try:
            while not stop.is_set():
                try:
                    self._step()
                    backoff = 0.1
                except RedisUnavailable as exc:
                    self.logger.error("redis unavailable, retrying", error=str(exc), retry_in_s=backoff)
                    self._recovering = True  # re-handle what was read but not acknowledged
                    stop.wait(backoff)
                    backoff = min(backoff * 2, 5.0)
                    continue
                if self.reg.state != last_state:
                    self.logger.info("registration", state=self.reg.state, why=self.reg.history[-1],
                                     epoch=self.reg.epoch)
                    last_state = self.reg.state
                if self.reg.state == "REFUSED":
                    self.logger.error("registration refused for good", reason=self.reg.refusal)
                    print(f"sluice taskmanager {self.resource_id}: registration refused: {self.reg.refusal}",
                          file=sys.stderr)
                    return 2
            self._leave()
            return 0
        finally:
            self._stop_workers()

    def _step(self) -> None:
        if self._recovering:
            entries = self.consumer.pending()
            self._recovering = False
        else:
            entries = self.consumer.read(count=100, block_ms=50)
        for entry in entries:
            msg = entry.envelope.event
            if isinstance(msg, SubmitTask):
                self._submit_task(msg)
            elif isinstance(msg, CancelTask):
                self._cancel_task(msg)
            elif isinstance(msg, UpdateTaskExecutionState):
                self._task_ended(msg)
            else:
                # The leader no longer counts our tasks in (it declared us lost, and tells us to
                # register again, or acknowledges a fresh registration): drop them here too.
                if isinstance(msg, DisconnectTaskManager) and msg.session == self.reg.session:
                    self._drop_all_tasks(msg.reason)
                elif isinstance(msg, AcknowledgeRegistration) and msg.session == self.reg.session and self.tasks:
                    self._drop_all_tasks("registered afresh: the leader had declared this TaskManager lost")
                for send in self.reg.receive(msg, now_ms()):
                    self._send(send.message, cause=entry.envelope.id)
            self.consumer.ack(entry.id)
        self._supervise()
        now = now_ms()
        if now >= self._next_trim:
            self.log.trim_consumed(self.inbox, GROUP, keep_ms=self.inbox_retention_ms, now_ms=now)
            self._next_trim = now + min(self.inbox_retention_ms, 10_000)
        leader = current_leader(self.log)
        free = self.reg.slots - len(self.tasks)
        for send in self.reg.tick(now_ms(), leader.epoch if leader else None, free):
            self._send(send.message)

    def _send(self, message: object, cause: str | None = None) -> None:
        self.log.append(self.cluster_inbox, Envelope(message, new_id(), 0, now_ms(), None, cause))  # type: ignore[arg-type]

    def _to_job(self, job_id: str, message: Event) -> None:
        self.log.append(self.keys.inbox(self.keys.job(job_id)), Envelope(message, new_id(), 0, now_ms(), job_id))

    def _skip_old_messages(self) -> None:
        """Messages to an earlier session of this resource id are void: start after them."""
        self.consumer.skip_to_end()

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

    # --- tasks ---------------------------------------------------------------------------

    def _submit_task(self, msg: SubmitTask) -> None:
        task = Task(dict(msg.descriptor), msg.slot)
        try:
            if not 0 <= msg.slot < self.reg.slots:
                raise TaskStartFailed("slot", ValueError(f"slot {msg.slot} does not exist (this TaskManager has "
                                                         f"{self.reg.slots})"))
            start(task, self.steps, on_undo_error=lambda step, exc: self.logger.error(
                "undo failed", step=step, error=str(exc)))
        except TaskStartFailed as exc:
            self.logger.warning("task start failed", task=task.id, step=exc.step, error=str(exc.cause),
                                undone=task.undone)
            self._to_job(msg.job_id, TaskOperationResult(msg.job_id, msg.execution_id, False, str(exc)))
            return
        self._to_job(msg.job_id, TaskOperationResult(msg.job_id, msg.execution_id, True, None))
        if not self.execute:  # a TaskManager that finishes tasks without running them (benchmarks)
            from sluice.events import ScheduleOrUpdateConsumers

            d = task.descriptor
            self._to_job(msg.job_id, self._state(task, TaskState.RUNNING))
            if d.get("output"):
                self._to_job(msg.job_id, ScheduleOrUpdateConsumers(d["job_id"], d["execution_id"], d["vertex"],
                                                                   d["subtask"], d["attempt"]))
            self._to_job(msg.job_id, self._state(task, TaskState.FINISHED))
            release(task, self.steps, keep_output=True)

    def _state(self, task: Task, state: TaskState, error: str | None = None) -> UpdateTaskExecutionState:
        d = task.descriptor
        return UpdateTaskExecutionState(d["job_id"], d["execution_id"], state, error, d["vertex"], d["subtask"],
                                        d["attempt"], self.resource_id, task.slot)

    def _launch(self, task: Task) -> str:
        # INITIALIZING goes out before the task is queued: an idle worker picks it up at
        # once and reports RUNNING, which must not overtake it.
        self._to_job(task.descriptor["job_id"], self._state(task, TaskState.INITIALIZING))
        if not self.execute:
            return "not-executed"
        runtime = {"code_path": str(task.code_path), "temp_dir": str(task.temp_dir), "host": self.reg.host,
                   "io_rate": self.io_rate}
        if task.descriptor.get("kind") != "noop":
            runtime["spark_remote"] = self._spark()
        return self.queues.enqueue(task.slot, RUN_TASK, (task.descriptor, runtime), job_id=new_id(),
                                   description=task.id)

    def _spark(self) -> str:
        """The Spark Connect server this TaskManager's workers use: the given one, or one it
        starts itself the first time a task needs Spark (one JVM shared by all its slots)."""
        if self.spark_remote is None:
            from sluice.services.embedded.spark_connect import SparkConnectServer

            (self.home / "logs").mkdir(parents=True, exist_ok=True)
            self._spark_server = SparkConnectServer(
                master=os.environ.get("SLUICE_SPARK_MASTER", "local[*]"),
                log_file=self.home / "logs" / f"{self.resource_id}-spark-connect.log")
            self.spark_remote = self._spark_server.start(wait=False)
            self.logger.info("started a Spark Connect server for this TaskManager", url=self.spark_remote)
        return self.spark_remote

    def _cancel_launch(self, task: Task) -> None:
        if task.rq_job and self.execute:
            self.queues.cancel(task.rq_job)

    def _cancel_task(self, msg: CancelTask) -> None:
        tid = f"{msg.job_id}/{msg.execution_id}"
        task = self.tasks.get(tid)
        if task is None:
            return  # it ended meanwhile; its final state is on its way
        self.logger.info("cancelling task", task=tid, reason=msg.reason)
        proc = self.workers.get(task.slot)
        started = self._rq_started(task)
        if started and proc is not None and proc.poll() is None:
            self.cancelling.add(tid)
            proc.kill()  # the supervisor reports CANCELED and starts a new worker
            return
        self._cancel_launch(task)
        self._to_job(msg.job_id, self._state(task, TaskState.CANCELED))
        release(task, self.steps, keep_output=False)

    def _drop_all_tasks(self, why: str) -> None:
        """The leader no longer counts this TaskManager in: its tasks were failed (and maybe
        restarted elsewhere), so stop them here and free their slots before registering again."""
        for task in list(self.tasks.values()):
            self.logger.warning("dropping task", task=task.id, why=why)
            self._cancel_launch(task)
            proc = self.workers.get(task.slot)
            if proc is not None and proc.poll() is None and self._rq_started(task):
                proc.kill()
                proc.wait()
                self._spawn_worker(task.slot)
            release(task, self.steps, keep_output=False)

    def _rq_started(self, task: Task) -> bool:
        if not self.execute or not task.rq_job:
            return False
        return self.queues.started(task.rq_job)

    def _task_ended(self, msg: UpdateTaskExecutionState) -> None:
        task = self.tasks.get(f"{msg.job_id}/{msg.execution_id}")
        if task is not None and msg.state.terminal:
            release(task, self.steps, keep_output=msg.state == TaskState.FINISHED)

    # --- workers -------------------------------------------------------------------------

    def _spawn_worker(self, slot: int) -> None:
        if self.redis_url is None:
            raise RuntimeError("a TaskManager that executes tasks needs the Redis URL to start its workers")
        cmd = [sys.executable, "-m", "sluice", "--redis", self.redis_url, "--prefix", self.keys.prefix,
               "--home", str(self.home), "worker", "--resource-id", self.resource_id, "--slot", str(slot)]
        logs = self.home / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        out = open(logs / f"{self.resource_id}-slot{slot}.log", "ab")
        env = {**os.environ, "SLUICE_SPARK_REMOTE": self.spark_remote} if self.spark_remote else None
        self.workers[slot] = subprocess.Popen(guarded(cmd, signal.SIGKILL), stdout=out, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL, env=env)
        out.close()

    def _supervise(self) -> None:
        for slot, proc in list(self.workers.items()):
            code = proc.poll()
            if code is None:
                continue
            task = self.tasks.slot_busy(slot)
            how = f"signal {-code}" if code < 0 else f"exit code {code}"
            if task is not None:
                if task.id in self.cancelling:
                    self.cancelling.discard(task.id)
                    self._to_job(task.descriptor["job_id"], self._state(task, TaskState.CANCELED))  # stale if dropped: ignored
                else:
                    self.logger.warning("worker died mid-task", slot=slot, task=task.id, how=how)
                    self._to_job(task.descriptor["job_id"], self._state(
                        task, TaskState.FAILED, f"the worker process of slot {slot} died ({how}) while running the task"))
                self._cancel_launch(task)  # still queued? the replacement worker must not run it
                release(task, self.steps, keep_output=False)
            else:
                self.logger.warning("worker died", slot=slot, how=how)
            self._spawn_worker(slot)

    def _stop_workers(self) -> None:
        for proc in self.workers.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.workers.values():
            try:
                proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.workers.clear()
        if self._spark_server is not None:
            self._spark_server.stop()
            self._spark_server = None


