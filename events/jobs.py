"""Job submission, deployment and task lifecycle (Flink's JobManager <-> TaskManager protocol)."""

from __future__ import annotations

from dataclasses import field

from .schema import JSON, Event, event
from .types import JobStatus, TaskState

__all__ = [
    "SubmitJob",
    "Success",
    "JobRefused",
    "CancelJob",
    "JobStatusChanged",
    "SubmitTask",
    "TaskOperationResult",
    "CancelTask",
    "UpdateTaskExecutionState",
    "ScheduleOrUpdateConsumers",
]


@event("SubmitJob")
class SubmitJob(Event):
    """A client submits a JobGraph; ``code_blob`` names the job's code by content hash."""

    job_id: str
    name: str
    job_graph: JSON
    code_blob: str
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


@event("JobStatusChanged")
class JobStatusChanged(Event):
    job_id: str
    status: JobStatus
    reason: str | None = None


@event("SubmitTask")
class SubmitTask(Event):
    """Deploy one execution attempt; ``descriptor`` is the task deployment descriptor."""

    job_id: str
    execution_id: str
    vertex_id: str
    subtask: int
    attempt: int
    slot: int
    descriptor: JSON


@event("TaskOperationResult")
class TaskOperationResult(Event):
    job_id: str
    execution_id: str
    success: bool
    message: str | None = None


@event("CancelTask")
class CancelTask(Event):
    job_id: str
    execution_id: str
    reason: str


@event("UpdateTaskExecutionState")
class UpdateTaskExecutionState(Event):
    job_id: str
    execution_id: str
    state: TaskState
    error: str | None = None


@event("ScheduleOrUpdateConsumers")
class ScheduleOrUpdateConsumers(Event):
    """A producer has data in ``result_id``/``partition``: deploy its consumers if not running."""

    job_id: str
    execution_id: str
    result_id: str
    partition: int
