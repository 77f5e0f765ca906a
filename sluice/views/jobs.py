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
from sluice.services.projector.core import EXECUTION_GRAPH
from sluice.store import EventLog, RedisBackend
from sluice.store.inspection import projected_row

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
        return {
            "job_id": job_id,
            "name": name,
            "status": "CREATED",
            "submitted_at": registered_at,
            "ended_at": None,
            "duration_s": _seconds(registered_at, until_ms(at)),
            "tasks_done": 0,
            "tasks_total": 0,
            "restarts": 0,
            "reason": None,
        }
    done = total = 0
    for vertex in run.vertices.values():
        for ex in vertex.subtasks:  # (current attempts: a speculative one beside it is not another task)
            total += 1
            done += ex.state._value_ == "FINISHED"
    end = run.ended_at if run.ended_at is not None else until_ms(at)
    return {
        "job_id": job_id,
        "name": run.name,
        "status": run.status._value_,
        "submitted_at": run.submitted_at,
        "ended_at": run.ended_at,
        "duration_s": _seconds(run.submitted_at, end),
        "tasks_done": done,
        "tasks_total": total,
        "restarts": run.restarts,
        "reason": run.reason,
    }


def jobs(log: EventLog, at: Moment = Moment(None)) -> list[dict]:
    """Every job the cluster had registered at the moment, in the order it registered them.
    Now, a job whose projected ExecutionGraph row is up to date (the projector's position
    is the job's last fact) is read from that row instead of folding its whole log."""
    cluster = cluster_at(log, at)
    out = []
    for job_id, reg in cluster.jobs.items():
        row = _projected(log, job_id, at)
        if row is None:
            run = job_at(log, job_id, at).run if _has_log(log, job_id) else None
            row = job_row(job_id, run, at, name=str(reg.get("name", "")), registered_at=reg.get("registered_at"))
        out.append(row)
    return out


def _projected(log: EventLog, job_id: str, at: Moment) -> dict | None:
    if at.entry is not None or not isinstance(log.backend, RedisBackend):
        return None
    tag = log.keys.job(job_id)
    pos, row, last = projected_row(log, tag, EXECUTION_GRAPH.name, "job", log.keys.facts(tag))
    if row is None or pos is None or pos != last:
        return None
    vertices = row.get("vertices") or []
    end = row["ended_at"] if row.get("ended_at") is not None else until_ms(at)
    return {
        "job_id": job_id,
        "name": row["name"],
        "status": row["status"],
        "submitted_at": row["submitted_at"],
        "ended_at": row.get("ended_at"),
        "duration_s": _seconds(row["submitted_at"], end),
        "tasks_done": sum(v["states"].get("FINISHED", 0) for v in vertices),
        "tasks_total": sum(v["parallelism"] for v in vertices),
        "restarts": row.get("restarts", 0),
        "reason": row.get("reason"),
    }


def _has_log(log: EventLog, job_id: str) -> bool:
    return log.last_id(log.keys.facts(log.keys.job(job_id))) is not None


def require_job(log: EventLog, job_id: str) -> None:
    """SluiceError naming the job and where to look when the log has no such job."""
    try:
        found = _has_log(log, job_id)
    except ConfigError:  # not even usable as an id
        found = False
    if not found:
        raise JobNotFound(f"job {job_id!r} not found under prefix {log.keys.prefix!r}: `sluice list` shows the jobs")
