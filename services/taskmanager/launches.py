"""Handing a task over to its slot's worker: the start's last step, and its undo.

A hand-over writes the start's two reports (the SubmitTask's result and INITIALIZING) with
the task, in one round trip. When its reply is lost the hand-over is *unsure*: the next
step asks whether it took effect (``confirm``) and hands the task over again only if not.
"""

from __future__ import annotations

from typing import Any

from sluice.errors import RedisUnavailable
from sluice.events import Envelope, TaskOperationResult, TaskState, descriptor_to_json
from sluice.services.common.metrics import TaskManagerMetrics
from sluice.services.common.world import World
from sluice.store import EventLog

from .reports import JobReports, task_state
from .slots import Slots
from .spark import SparkShare
from .tasks import Task, TaskTable

__all__ = ["Launches"]


class Launches:
    def __init__(
        self,
        log: EventLog,
        world: World,
        *,
        workers: Slots,
        tasks: TaskTable,
        reports: JobReports,
        spark: SparkShare,
        resource_id: str,
        host: str,
        io_rate: float,
        execute: bool,
        logger: Any,
        metrics: TaskManagerMetrics,
    ) -> None:
        self.log, self.world, self.workers, self.tasks = log, world, workers, tasks
        self.reports, self.spark = reports, spark
        self.resource_id, self.host, self.io_rate, self.execute = resource_id, host, io_rate, execute
        self.logger, self.metrics = logger, metrics
        self.unsure: dict[str, tuple[str, dict[str, Any]]] = {}
        """Task id -> (handle, runtime) of a hand-over whose reply was lost (it may or may not
        have taken effect): settled by ``confirm``."""

    def launch(self, task: Task) -> str:
        # The start's two reports, its SubmitTask's result and INITIALIZING, are written with
        # the hand-over to the slot's worker, in one round trip and before it (ProcessSlots:
        # one MULTI/EXEC). An idle worker picks the task up at once and reports RUNNING, which
        # must not overtake INITIALIZING (the leader drops a late INITIALIZING, and the log
        # would skip a state). Launch is the start's last step, so the result can say it
        # succeeded. The leader reads both reports in one batch: one commit, not two.
        # A Redis error before the hand-over fails this step, not the task: the start is
        # undone and tried again (a repeated report is ignored).
        d = task.descriptor
        self.reports.flush()  # reports owed from earlier go first
        if not self.execute:
            self.reports.to_job(d.job_id, task_state(task, TaskState.INITIALIZING, self.resource_id))
            return "not-executed"
        runtime: dict[str, Any] = {"host": self.host}  # a no-op task needs nothing more (worker.run_task)
        if d.kind != "noop":
            runtime.update(
                code_path=str(task.code_path),
                temp_dir=str(task.temp_dir),
                io_rate=self.io_rate,
                spark_remote=self.spark.url(),
                partitions=self.spark.partitions(d.parallelism),
            )
        return self._hand_over(task, runtime)

    def _hand_over(self, task: Task, runtime: dict[str, Any]) -> str:
        d = task.descriptor
        inbox = self.log.keys.inbox(self.log.keys.job(d.job_id))
        reports = [
            (inbox, Envelope(message, self.world.new_id(), 0, self.world.now_ms(), d.job_id))
            for message in (
                TaskOperationResult(d.job_id, d.execution_id, True, None),
                task_state(task, TaskState.INITIALIZING, self.resource_id),
            )
        ]
        handle = self.world.new_id()
        try:
            self.workers.launch(
                task.slot, descriptor_to_json(d), runtime, task_id=task.id, handle=handle, reports=reports
            )
        except RedisUnavailable as exc:
            # The transaction may have taken effect with only its reply lost. The start
            # stands: undoing it would delete the temp files and output of a task its worker
            # may be running now, and trying again would run it twice. Once Redis answers,
            # ``confirm`` asks which, and hands it over again only if it was not.
            self.unsure[task.id] = (handle, runtime)
            self.logger.warning(
                "a task's hand-over may not have taken effect; asking once Redis is back",
                task=task.id,
                error=str(exc)[:200],
            )
            return handle
        self.metrics.appended((env.type for _, env in reports), "inbox")
        return handle

    def confirm(self) -> None:
        """Settle the hand-overs whose reply was lost: keep one that took effect, hand the task
        over again if it did not (RedisUnavailable: asked again at the next step)."""
        for tid, (handle, runtime) in list(self.unsure.items()):
            task = self.tasks.get(tid)
            if task is None or task.rq_job != handle:  # dropped or cancelled meanwhile
                del self.unsure[tid]
            elif self.workers.handed_over(handle):
                del self.unsure[tid]
                self.logger.info("a hand-over whose reply was lost had taken effect", task=tid)
            else:
                del self.unsure[tid]
                task.rq_job = self._hand_over(task, runtime)

    def cancel(self, task: Task) -> None:
        """Take the task out of its worker's queue if no worker has begun it (the undo of launch)."""
        if task.rq_job and self.execute:
            self.workers.cancel_queued(task.rq_job)

    def started(self, task: Task) -> bool:
        """Whether the slot's worker began the task."""
        return bool(self.execute and task.rq_job and self.workers.started(task.rq_job))
