"""The legal moves of a task attempt and of a job: one table each, in one place.

Every state change of a task or a job is decided by the jobs core and recorded as a fact;
``evolve`` (services/jobs/state.py) checks each fact against these tables before it
applies it, and refuses an illegal one with :class:`~sluice.errors.IllegalTransition`,
whose message tells that attempt's (or job's) recent story, so a bug report explains
itself (as dask's worker state machine does). The simulation runs every fact through the
same ``evolve``, so it checks the tables on every run.
"""

from __future__ import annotations

from sluice.errors import IllegalTransition
from sluice.events import JobStatus, TaskState

__all__ = ["TASK_MOVES", "JOB_MOVES", "REPORTED", "RESTART_FROM", "check_task", "check_job", "story"]

C, SC, DE, IN, RU, FI, CI, CA, FA = (TaskState.CREATED, TaskState.SCHEDULED, TaskState.DEPLOYING,
                                     TaskState.INITIALIZING, TaskState.RUNNING, TaskState.FINISHED,
                                     TaskState.CANCELING, TaskState.CANCELED, TaskState.FAILED)

TASK_MOVES: dict[tuple[TaskState, TaskState], str] = {
    (C, SC): "the scheduler took a slot for it",
    (C, CA): "its job was cancelled or failed before it was deployed",
    (SC, DE): "sent to its TaskManager",
    (SC, CA): "its job was cancelled or failed before it was deployed",
    (SC, FA): "its TaskManager was lost before it was deployed",
    (DE, IN): "its TaskManager started it",
    (DE, RU): "its worker runs it (the INITIALIZING report is still on its way)",
    (DE, FI): "it finished (earlier reports still on their way)",
    (DE, FA): "deploying it failed, its TaskManager was lost, or the log restarted",
    (DE, CI): "its job is being cancelled or failing",
    (DE, CA): "the log restarted while its job was ending",
    (IN, RU): "its worker runs it",
    (IN, FI): "it finished (the RUNNING report is still on its way)",
    (IN, FA): "it failed, or its TaskManager was lost, or the log restarted",
    (IN, CI): "its job is being cancelled or failing",
    (IN, CA): "the log restarted while its job was ending",
    (RU, FI): "it finished",
    (RU, FA): "it failed, or its TaskManager was lost, or the log restarted",
    (RU, CI): "its job is being cancelled or failing",
    (RU, CA): "the log restarted while its job was ending",
    (CI, CA): "its TaskManager stopped it",
    (CI, FA): "it failed while being cancelled",
    (CI, FI): "it finished before the cancel reached it",
}
"""(from, to) -> why such a move happens. Anything else is a bug."""

REPORTED: frozenset[tuple[TaskState, TaskState]] = frozenset({
    (DE, IN), (DE, RU), (IN, RU), (DE, FI), (IN, FI), (RU, FI), (DE, FA), (IN, FA), (RU, FA),
    (CI, CA), (CI, FA), (CI, FI),
})
"""The moves a TaskManager or worker may report for the current attempt (any other report
is stale or out of order, and is ignored with the reason)."""

RESTART_FROM: frozenset[TaskState] = frozenset({FA, C})
"""A new attempt starts after a failed one (a restart), or replaces one that never ran (the
log restarted: it may have been deployed by a write that was lost)."""

JOB_MOVES: dict[tuple[JobStatus, JobStatus], str] = {
    (JobStatus.CREATED, JobStatus.RUNNING): "every source runs",
    (JobStatus.CREATED, JobStatus.FINISHED): "every task finished",
    (JobStatus.RUNNING, JobStatus.FINISHED): "every task finished",
    (JobStatus.CREATED, JobStatus.FAILING): "a task failed beyond its restarts, or a coordinator failed",
    (JobStatus.RUNNING, JobStatus.FAILING): "a task failed beyond its restarts, or a coordinator failed",
    (JobStatus.CREATED, JobStatus.CANCELLING): "cancelled",
    (JobStatus.RUNNING, JobStatus.CANCELLING): "cancelled",
    (JobStatus.FAILING, JobStatus.FAILED): "every task stopped",
    (JobStatus.CANCELLING, JobStatus.CANCELED): "every task stopped",
}


def story(history: list[tuple[int, str]] | None) -> str:
    if not history:
        return "(no earlier moves)"
    return "; ".join(f"{ts} {what}" for ts, what in history)


def check_task(what: str, old: TaskState, new: TaskState, history: list[tuple[int, str]] | None) -> None:
    if (old, new) not in TASK_MOVES:
        raise IllegalTransition(f"{what}: {old.value} -> {new.value} is not a legal move of a task attempt. "
                                f"Its story: {story(history)}")


def check_job(job_id: str, old: JobStatus, new: JobStatus, history: list[tuple[int, str]] | None) -> None:
    if (old, new) not in JOB_MOVES:
        raise IllegalTransition(f"job {job_id}: {old.value} -> {new.value} is not a legal move of a job. "
                                f"Its story: {story(history)}")
