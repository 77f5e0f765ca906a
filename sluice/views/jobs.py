"""Every registered job at a moment: one row each (``sluice inspect``'s job list, the
dashboard's Jobs page).

A row (JSON)::

    {"job_id", "name", "status", "submitted_at", "ended_at", "duration_s",
     "tasks_done", "tasks_total", "restarts", "reason"}

Times are milliseconds since the epoch; ``duration_s`` runs to the job's end, or to the
moment asked about (now: the wall clock) while it has not ended. A job registered but
whose own log has no ``JobSubmitted`` yet at that moment is ``CREATED`` with no tasks.
"""

from __future__ import annotations

import time

from sluice.errors import ConfigError, JobNotFound
from sluice.services.jobs.state import JobRun
from sluice.store import EventLog

from .history import Moment, cluster_at, job_at

__all__ = ["jobs", "job_row", "until_ms", "require_job"]


def until_ms(at: Moment) -> int:
    """The time an open interval runs to: the moment's, or now."""
    return at.ms if at.ms is not None else time.time_ns() // 1_000_000


def _seconds(start: int | None, end: int | None) -> float | None:
    return None if start is None or end is None else round(max(end - start, 0) / 1000, 3)


def job_row(job_id: str, run: JobRun | None, at: Moment, *, name: str = "", registered_at: int | None = None) -> dict:
    """One job's row (``run``: its ExecutionGraph at the moment, None before it was submitted)."""
    if run is None:
        return {"job_id": job_id, "name": name, "status": "CREATED", "submitted_at": registered_at,
                "ended_at": None, "duration_s": _seconds(registered_at, until_ms(at)), "tasks_done": 0,
                "tasks_total": 0, "restarts": 0, "reason": None}
    done = total = 0
    for ex in run.executions():
        total += 1
        done += ex.state._value_ == "FINISHED"
    end = run.ended_at if run.ended_at is not None else until_ms(at)
    return {"job_id": job_id, "name": run.name, "status": run.status._value_, "submitted_at": run.submitted_at,
            "ended_at": run.ended_at, "duration_s": _seconds(run.submitted_at, end), "tasks_done": done,
            "tasks_total": total, "restarts": run.restarts, "reason": run.reason}


def jobs(log: EventLog, at: Moment = Moment(None)) -> list[dict]:
    """Every job the cluster had registered at the moment, in the order it registered them."""
    cluster = cluster_at(log, at)
    out = []
    for job_id, reg in cluster.jobs.items():
        run = job_at(log, job_id, at).run if _has_log(log, job_id) else None
        out.append(job_row(job_id, run, at, name=str(reg.get("name", "")), registered_at=reg.get("registered_at")))
    return out


def _has_log(log: EventLog, job_id: str) -> bool:
    return log.last_id(log.keys.facts(log.keys.job(job_id))) is not None


def require_job(log: EventLog, job_id: str) -> None:
    """SluiceError naming the job and where to look when the log has no such job."""
    try:
        found = _has_log(log, job_id)
    except ConfigError:  # not even usable as an id
        found = False
    if not found:
        raise JobNotFound(f"job {job_id!r} not found under prefix {log.keys.prefix!r}: "
                          "`sluice list` shows the jobs")
