"""Job submission, deployment and task lifecycle (Flink's JobManager <-> TaskManager protocol).

``PurgeJob`` / ``JobPurged`` remove an ended job's keys (Sluice's own: Flink has none).

Messages keep Flink's names. Facts in a job's stream are ``JobSubmitted``,
``ExecutionGraphBuilt``, ``UpdateTaskExecutionState`` (every state change of every
execution attempt, decided by the leader), ``ScheduleOrUpdateConsumers`` (a producer's
partition is ready), ``TaskRestartScheduled``, ``JobWaitingForSlots``, ``JobSlotsFound`` and ``JobStatusChanged``.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

from .descriptor import TaskDeploymentDescriptor
from .jobgraph import JobGraph
from .schema import JSON, Event, event
from .types import JobStatus, TaskState

__all__ = [
    "SubmitJob",
    "Success",
    "JobRefused",
    "CancelJob",
    "JobRegistered",
    "PurgeJob",
    "JobPurged",
    "JobSubmitted",
    "ExecutionGraphBuilt",
    "AttemptsRenumbered",
    "JobStatusChanged",
    "JobWaitingForSlots",
    "JobSlotsFound",
    "SubmitTask",
    "TaskOperationResult",
    "CancelTask",
    "UpdateTaskExecutionState",
    "ScheduleOrUpdateConsumers",
    "TaskRestartScheduled",
]


@event("SubmitJob")
class SubmitJob(Event):
    """A client submits a JobGraph; ``code_blob`` names the job's code by content hash,
    ``reply_to`` the inbox that gets ``Success`` or ``JobRefused``."""

    job_id: str
    graph: JobGraph
    code_blob: str
    module: str
    reply_to: str
    params: dict[str, str] = field(default_factory=dict)


@event("Success")
class Success(Event):
    """Sent to the submitting client once the job's sources run."""

    job_id: str


@event("JobRefused")
class JobRefused(Event):
    job_id: str
    reason: str


@event("CancelJob")
class CancelJob(Event):
    job_id: str
    reason: str


@event("JobRegistered")
class JobRegistered(Event):
    """Cluster fact: the leader took the job in; its inbox is served from now on."""

    job_id: str
    name: str


@event("PurgeJob")
class PurgeJob(Event):
    """To the cluster inbox: remove an ended job's keys entirely (``sluice job purge``),
    leaving one tombstone row. ``reply_to`` gets ``JobPurged`` or ``JobRefused``."""

    job_id: str
    reply_to: str


@event("JobPurged")
class JobPurged(Event):
    """Cluster fact (and the reply to ``PurgeJob``): the job's keys are gone; its id stays
    taken. ``status``, ``ended_at`` and ``reason`` are how it had ended; ``purged_at``
    when it went (ms since the epoch)."""

    job_id: str
    name: str
    status: JobStatus
    ended_at: int | None
    purged_at: int
    reason: str | None = None


@event("JobSubmitted")
class JobSubmitted(Event):
    """Job fact: the accepted graph, its code, and the input splits of every source vertex."""

    job_id: str
    graph: JobGraph
    code_blob: str
    module: str
    reply_to: str
    params: dict[str, str]
    splits: dict[str, list[JSON]]
    storage_root: str


@event("ExecutionGraphBuilt", version=2)
class ExecutionGraphBuilt(Event):
    """Every vertex expanded to its subtasks (all CREATED), results and edges wired. Every
    subtask's first attempt is numbered ``first_attempt``: 0, or after a restart of Redis
    that may have lost writes, a number no attempt started before it can have had.
    Version 2 added ``first_attempt``."""

    job_id: str
    subtasks: int
    results: int
    first_attempt: int = 0


@event("AttemptsRenumbered")
class AttemptsRenumbered(Event):
    """After Redis restarted and may have lost writes, every unfinished subtask of the job
    runs again as an attempt numbered at least ``attempt_floor`` (the facts that follow
    say which); a job renumbered at a floor is never renumbered at it again."""

    job_id: str
    attempt_floor: int
    reason: str


@event("JobStatusChanged")
class JobStatusChanged(Event):
    job_id: str
    status: JobStatus
    reason: str | None = None


@event("JobWaitingForSlots", version=2)
class JobWaitingForSlots(Event):
    """Deployable tasks wait: ``needed`` slots wanted (at most: tasks still queued behind the
    first that found no slot are counted unchecked), ``free`` available (0 = none at all).

    Recorded when a wait begins. With ``until_placed`` (v2) the wait lasts until
    ``JobSlotsFound``, however many slots the job takes meanwhile: a job of many tasks on a
    few slots records one wait, not one for every slot freed. A v1 fact (read with
    ``until_placed`` False) lasted until the job's next slot taken, and was recorded again
    after it."""

    job_id: str
    needed: int
    free: int
    until_placed: bool = True


@event("JobSlotsFound")
class JobSlotsFound(Event):
    """The wait ``JobWaitingForSlots`` began is over: every task of the job that could be
    deployed has a slot."""

    job_id: str


@event("SubmitTask", version=2)
class SubmitTask(Event):
    """Deploy one execution attempt on ``taskmanager``'s ``slot``; ``descriptor`` is the
    task deployment descriptor (code, inputs, output, splits): a typed record since
    version 2 (version 1 carried the same fields as free JSON)."""

    job_id: str
    execution_id: str
    vertex_id: str
    subtask: int
    attempt: int
    slot: int
    descriptor: TaskDeploymentDescriptor


@event("TaskOperationResult", version=2)
class TaskOperationResult(Event):
    """The TaskManager's answer to ``SubmitTask``: the attempt started, or why not.
    ``retryable`` False: another attempt would fail the same way (the TaskManager cannot
    see the job's storage root or inputs), so the job fails without restarts. Version 2
    added ``retryable``."""

    job_id: str
    execution_id: str
    success: bool
    message: str | None = None
    retryable: bool = True

    def written_as(self) -> tuple[int, dict[str, Any]] | None:
        """Version 1 while ``retryable`` is True (what a v1 reader takes every failure for):
        TaskManagers are upgraded before the leader, so nearly every answer of an upgraded
        one stays readable by a leader not yet upgraded."""
        if not self.retryable:
            return None
        return 1, {
            "job_id": self.job_id,
            "execution_id": self.execution_id,
            "success": self.success,
            "message": self.message,
        }


@event("CancelTask")
class CancelTask(Event):
    job_id: str
    execution_id: str
    reason: str


@event("UpdateTaskExecutionState", version=4)
class UpdateTaskExecutionState(Event):
    """One state change of one execution attempt. Sent by TaskManagers and recorded by the
    leader (with where it runs) as a fact. ``session`` (on the leader's SCHEDULED fact) is
    the registration of the TaskManager the attempt was placed on: when that session is
    gone, so is the attempt. ``retryable`` False (on a FAILED report): the TaskManager
    classified the failure as deterministic (services/taskmanager/classify.py), so the job
    fails at once, without restarts. Version 2 added the vertex, subtask, attempt and
    location fields, version 3 ``session``, version 4 ``retryable``."""

    job_id: str
    execution_id: str
    state: TaskState
    error: str | None = None
    vertex_id: str = ""
    subtask: int = -1
    attempt: int = -1
    taskmanager: str | None = None
    slot: int | None = None
    session: str | None = None
    retryable: bool = True

    def written_as(self) -> tuple[int, dict[str, Any]] | None:
        """Version 3 while ``retryable`` is True (what a v3 reader takes every failure for),
        as TaskOperationResult does: a leader not yet upgraded reads every report but a
        deterministic failure's."""
        if not self.retryable:
            return None
        return 3, {
            "job_id": self.job_id,
            "execution_id": self.execution_id,
            "state": self.state,
            "error": self.error,
            "vertex_id": self.vertex_id,
            "subtask": self.subtask,
            "attempt": self.attempt,
            "taskmanager": self.taskmanager,
            "slot": self.slot,
            "session": self.session,
        }


@event("ScheduleOrUpdateConsumers")
class ScheduleOrUpdateConsumers(Event):
    """A producer's result partition has data: deploy its consumers if they are not running."""

    job_id: str
    execution_id: str
    vertex_id: str
    subtask: int
    attempt: int


@event("TaskRestartScheduled")
class TaskRestartScheduled(Event):
    """A failed subtask gets attempt ``attempt`` no earlier than ``not_before`` (ms)."""

    job_id: str
    vertex_id: str
    subtask: int
    attempt: int
    not_before: int
    restarts: int
