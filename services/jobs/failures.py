"""Failures, pure: an attempt failed (restarted if the job's strategy allows), a job fails or
is cancelled (its tasks are cancelled), an attempt its TaskManager no longer runs, and the
end of a stopping job once every task ended. Shared by the jobs core's handlers
(services/jobs/core.py, services/jobs/losses.py) and reconciliation (services/jobs/reconcile.py).
"""

from __future__ import annotations

from sluice.events import (
    CancelTask,
    JobStatus,
    JobStatusChanged,
    TaskRestartScheduled,
    TaskState,
)
from sluice.services.common.decision import Address

from .machine import LIVE_JOB, LIVE_TASK, UNDEPLOYED_TASK
from .recorder import Recorder
from .speculation import concurrent_failure, next_attempt
from .state import Execution, JobRun
from .stimuli import JobsConfig

__all__ = ["fail", "fail_job", "cancel_all", "maybe_complete", "gone"]


def fail(rec: Recorder, job: JobRun, ex: Execution, error: str, config: JobsConfig, restart: bool = True) -> None:
    """An execution failed: restart it if the job's strategy allows (and ``restart``), else fail the job.
    (One that runs beside another attempt of its subtask is not restarted: services/jobs/speculation.py.)"""
    if job.speculating and concurrent_failure(rec, job, ex, error):
        return
    rec.move(ex, TaskState.FAILED, error)
    if job.status not in LIVE_JOB:
        maybe_complete(rec, job)
        return
    strategy = job.graph.restart
    if restart and strategy.kind != "none" and job.restarts < strategy.attempts:
        delay = strategy.delay_ms
        if strategy.kind == "exponential-backoff":
            delay = min(strategy.delay_ms * (2**job.restarts), strategy.max_delay_ms)
        rec.fact(
            TaskRestartScheduled(
                job.job_id,
                ex.vertex,
                ex.subtask,
                next_attempt(job, ex) if job.speculating else ex.attempt + 1,
                rec.now + delay,
                job.restarts + 1,
            )
        )
        return
    tried = (
        f"after {job.restarts} restart{'s' if job.restarts != 1 else ''}"
        if strategy.kind != "none"
        else "(restart strategy: none)"
    )
    if not restart:
        tried = "(no restart)"
    fail_job(rec, job, f"task {ex.vertex}[{ex.subtask}] failed {tried}: {error}")


def fail_job(rec: Recorder, job: JobRun, reason: str, cancel_reason: str = "the job is failing") -> None:
    """The job fails with ``reason`` as its root cause: its tasks are cancelled."""
    rec.fact(JobStatusChanged(job.job_id, JobStatus.FAILING, reason))
    cancel_all(rec, job, cancel_reason)
    maybe_complete(rec, job)


def cancel_all(rec: Recorder, job: JobRun, reason: str) -> None:
    for ex in job.executions():
        if ex.state in UNDEPLOYED_TASK:
            rec.move(ex, TaskState.CANCELED)
        elif ex.state in LIVE_TASK:
            rec.move(ex, TaskState.CANCELING)
            rec.send(Address.taskmanager(ex.taskmanager or ""), CancelTask(job.job_id, ex.id, reason))


def maybe_complete(rec: Recorder, job: JobRun) -> None:
    if job.status == JobStatus.FAILING and job.all_terminal():
        rec.fact(JobStatusChanged(job.job_id, JobStatus.FAILED, None))
    elif job.status == JobStatus.CANCELLING and job.all_terminal():
        rec.fact(JobStatusChanged(job.job_id, JobStatus.CANCELED, None))


def gone(rec: Recorder, job: JobRun, ex: Execution, reason: str, config: JobsConfig) -> None:
    """An attempt its TaskManager no longer runs (lost, or it does not hold it): one being
    cancelled is CANCELED, any other FAILED with ``reason`` (and restarted if it may be)."""
    if ex.state == TaskState.CANCELING:
        rec.move(ex, TaskState.CANCELED)
    else:
        fail(rec, job, ex, reason, config)
