"""A TaskManager's slots and the tasks they hold: started step by step, cancelled, ended,
dropped, and their workers supervised.

A slot runs one task at a time (``TaskTable``); its worker is behind ``Slots``. Reports go
through ``JobReports`` (queued while the bookkeeping is done, sent after: a Redis error on
the way must not leave a task half-recorded), and each final state is remembered in
``FinalStates`` until the leader confirms it.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from sluice.errors import BroadcastTooLarge, RedisUnavailable, StorageUnreachable
from sluice.events import (
    AttemptReport,
    CancelTask,
    ScheduleOrUpdateConsumers,
    SubmitTask,
    TaskOperationResult,
    TaskState,
    UpdateTaskExecutionState,
)

from .inputs import broadcast_problem
from .launches import Launches
from .reach import Reach
from .reports import FinalStates, JobReports, cancelled, task_state
from .slots import Slots
from .tasks import Step, Task, TaskStartFailed, TaskTable, release, start

__all__ = ["SlotPool"]


class SlotPool:
    def __init__(
        self,
        *,
        size: int,
        tasks: TaskTable,
        workers: Slots,
        steps: list[Step],
        launches: Launches,
        reports: JobReports,
        finals: FinalStates,
        reach: Reach,
        resource_id: str,
        execute: bool,
        logger: Any,
    ) -> None:
        self.size = size
        """How many slots this TaskManager has."""
        self.tasks, self.workers, self.steps, self.launches = tasks, workers, steps, launches
        self.reports, self.finals, self.reach = reports, finals, reach
        self.resource_id, self.execute, self.logger = resource_id, execute, logger
        self.cancelling: set[str] = set()
        """Tasks whose worker was killed to cancel them: reported CANCELED once seen dead."""
        self.exits: deque[tuple[int, str]] = deque()
        """Workers seen dead, not yet recorded, as (slot, how)."""

    def held(self) -> list[AttemptReport]:
        """What the slots hold: DEPLOYING until handed to its worker, then RUNNING."""
        return [
            AttemptReport(
                t.descriptor.job_id, t.descriptor.execution_id, TaskState.RUNNING if t.rq_job else TaskState.DEPLOYING
            )
            for t in self.tasks.values()
        ]

    def free(self) -> int:
        return self.size - len(self.tasks)

    def _state(self, task: Task, state: TaskState, error: str | None = None) -> UpdateTaskExecutionState:
        return task_state(task, state, self.resource_id, error)

    def submit(self, msg: SubmitTask) -> None:
        tid = f"{msg.job_id}/{msg.execution_id}"
        if tid in self.tasks:
            return  # this very attempt runs here already: the SubmitTask came twice
        task = Task(msg.descriptor, msg.slot)
        busy = self.tasks.slot_busy(msg.slot) if 0 <= msg.slot < self.size else None
        if (
            busy is not None
            and busy.descriptor.job_id == msg.job_id
            and (busy.descriptor.vertex, busy.descriptor.subtask) == (msg.vertex_id, msg.subtask)
            and busy.descriptor.attempt > msg.attempt
        ):
            self.logger.warning("stale SubmitTask ignored: a newer attempt runs in its slot", old=tid, new=busy.id)
            return
        if busy is not None:
            # The leader gave the slot to a new attempt, so it no longer counts the one here
            # (it failed it: this TaskManager was lost, or its report was): that one goes.
            self.logger.warning(
                "slot taken over by a new attempt; dropping the old one", slot=msg.slot, old=busy.id, new=tid
            )
            self.drop(busy, "its slot was given to another attempt")
        try:
            if not 0 <= msg.slot < self.size:
                raise TaskStartFailed(
                    "slot", ValueError(f"slot {msg.slot} does not exist (this TaskManager has {self.size})")
                )
            try:
                self.reach.check(task.descriptor)  # once per job: its storage root and inputs are here
            except StorageUnreachable as exc:
                raise TaskStartFailed("storage root", exc) from exc
            too_large = broadcast_problem(task.descriptor)  # its broadcast inputs' producers have finished
            if too_large is not None:
                raise TaskStartFailed("broadcast inputs", too_large)
            start(
                task,
                self.steps,
                on_undo_error=lambda step, exc: self.logger.error("undo failed", step=step, error=str(exc)),
            )
        except TaskStartFailed as exc:
            if isinstance(exc.cause, RedisUnavailable):  # not the task's fault: start it again later
                raise exc.cause from exc
            self.logger.warning(
                "task start failed", task=task.id, step=exc.step, error=str(exc.cause), undone=task.undone
            )
            self.reports.to_job(
                msg.job_id,
                TaskOperationResult(
                    msg.job_id,
                    msg.execution_id,
                    False,
                    str(exc),
                    not isinstance(exc.cause, (StorageUnreachable, BroadcastTooLarge)),
                ),
            )
            return
        if not self.execute:  # a TaskManager that finishes tasks without running them (benchmarks)
            # Reports are queued first and sent once the bookkeeping is done: a Redis error
            # while sending must not leave the task half-recorded (its reports stay owed).
            # (A worker's launch sent its SubmitTask's result with the hand-over.)
            to_job = self.reports.to_job
            to_job(msg.job_id, TaskOperationResult(msg.job_id, msg.execution_id, True, None), flush=False)
            d = task.descriptor
            to_job(msg.job_id, self._state(task, TaskState.RUNNING), flush=False)
            if d.output:
                to_job(
                    msg.job_id,
                    ScheduleOrUpdateConsumers(d.job_id, d.execution_id, d.vertex, d.subtask, d.attempt),
                    flush=False,
                )
            to_job(msg.job_id, self._state(task, TaskState.FINISHED), flush=False)
            self.finals.remember(task, TaskState.FINISHED)
            release(task, self.steps, keep_output=True)
        self.reports.flush()

    def cancel(self, msg: CancelTask) -> None:
        tid = f"{msg.job_id}/{msg.execution_id}"
        task = self.tasks.get(tid)
        if task is None:
            # Not here (it ended, failed to start, or ran in an earlier session): whatever
            # it was, it is not running, so the leader may stop waiting for it.
            self.reports.to_job(msg.job_id, cancelled(msg, self.resource_id))
            return
        self.logger.info("cancelling task", task=tid, reason=msg.reason)
        if self.launches.started(task) and self.workers.alive(task.slot):
            self.cancelling.add(tid)
            self.workers.kill(task.slot)  # the supervisor reports CANCELED and starts a new worker
            return
        self.launches.cancel(task)
        self.reports.to_job(msg.job_id, self._state(task, TaskState.CANCELED), flush=False)
        self.finals.remember(task, TaskState.CANCELED)
        release(task, self.steps, keep_output=False)
        self.reports.flush()

    def ended(self, msg: UpdateTaskExecutionState) -> None:
        """A task's final state, from its worker or the leader's release."""
        task = self.tasks.get(f"{msg.job_id}/{msg.execution_id}")
        if task is not None and msg.state.terminal:
            if msg.taskmanager == self.resource_id:  # its worker's report (not the leader's release)
                self.finals.remember(task, msg.state, msg.error)
            release(task, self.steps, keep_output=msg.state == TaskState.FINISHED)

    def drop(self, task: Task, why: str) -> None:
        """Stop a task the leader no longer counts (no report: it was failed already). Its
        output stays: it may have finished a moment ago, with its report still on the way,
        and then consumers read it (the leader decides which attempt's output counts)."""
        self.logger.warning("dropping task", task=task.id, why=why)
        self.launches.cancel(task)
        if self.launches.started(task):
            if self.workers.alive(task.slot):
                self.workers.kill(task.slot, wait=True)
            self._sweep_sink(task)
        self.cancelling.discard(task.id)
        release(task, self.steps, keep_output=True)

    def drop_all(self, why: str) -> None:
        """The leader no longer counts this TaskManager in: its tasks were failed (and maybe
        restarted elsewhere), so stop them here and free their slots before registering again."""
        for task in list(self.tasks.values()):
            self.drop(task, why)

    def _sweep_sink(self, task: Task, cancelled: bool = False) -> None:
        """The task's worker is dead. If it was a stale attempt of a sink subtask, it may have
        died halfway through publishing, after the newer attempt had cleaned up: its files
        would stay in the sink for good. Delete every file of the subtask's attempts older
        than its newest published one (always safe: those attempts never count). One the
        leader ``cancelled`` (a speculative attempt that lost its race, though the newest)
        goes too if it never published: it never counts either."""
        sink = task.descriptor.sink
        if sink is None:
            return
        try:
            d = task.descriptor
            self.workers.sweep_sink(sink.path, d.subtask, d.attempt if cancelled else None)
        except Exception as exc:  # the storage is away: the newer attempt's own clean-up remains
            self.logger.warning(
                "could not clean the sink after a killed attempt",
                task=task.id,
                sink=sink.path,
                error=f"{type(exc).__name__}: {exc}"[:300],
            )

    def supervise(self) -> None:
        """Record the workers that died. Each exit is seen once, so it is kept until it is
        recorded (its report queued, its slot freed), and reports are sent only after: a Redis
        error on the way must not lose an exit (its slot would stay busy, its task unreported)."""
        self.exits.extend(self.workers.exited())
        while self.exits:
            slot, how = self.exits[0]
            task = self.tasks.slot_busy(slot)
            if task is None:
                self.logger.warning("worker died", slot=slot, how=how)
                self.exits.popleft()
                continue
            self.launches.cancel(task)  # still queued? the replacement worker must not run it
            cancelled_here = task.id in self.cancelling
            self._sweep_sink(task, cancelled=cancelled_here)
            if cancelled_here:
                self.cancelling.discard(task.id)
                self.reports.to_job(task.descriptor.job_id, self._state(task, TaskState.CANCELED), flush=False)
                self.finals.remember(task, TaskState.CANCELED)
            else:
                self.logger.warning("worker died mid-task", slot=slot, task=task.id, how=how)
                error = f"the worker process of slot {slot} died ({how}) while running the task"
                self.reports.to_job(task.descriptor.job_id, self._state(task, TaskState.FAILED, error), flush=False)
                self.finals.remember(task, TaskState.FAILED, error)
            # Its output stays unless the leader had cancelled it: the worker may have died right
            # after reporting FINISHED to the job (its copy to this TaskManager lost with it), and
            # then consumers read that partition (the leader decides which attempt counts).
            release(task, self.steps, keep_output=not cancelled_here)
            self.exits.popleft()
        self.reports.flush()
