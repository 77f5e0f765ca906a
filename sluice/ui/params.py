"""What every endpoint reads from a request: the log, the moment (``?at=``), a job that
must exist; and ``@query``, which names an endpoint's query parameters for OpenAPI."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request

from sluice.store import EventLog
from sluice.views.history import Moment, resolve_at

from .errors import ApiError

__all__ = ["AT", "query", "log_of", "at_of", "known_job"]

AT = (
    "Show the state as it was at this moment: an entry id of the job's (or the cluster's) fact stream, "
    "milliseconds since the epoch, or an ISO 8601 time. Absent: now."
)


def query(**params: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare an endpoint's query parameters (name -> description) for the OpenAPI document."""

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn.__dict__["query_params"] = params
        return fn

    return mark


def log_of(request: Request) -> EventLog:
    log: EventLog = request.app.state.log
    return log


def at_of(request: Request) -> Moment:
    """``?at=`` as a Moment; a value that is none of the forms is a 400 naming them."""
    return resolve_at(request.query_params.get("at"))


def known_job(log: EventLog, job_id: str) -> str:
    """``job_id`` if the log has the job's fact stream; else a 404 that says where the jobs are."""
    if log.last_id(log.keys.facts(log.keys.job(job_id))) is None:
        raise ApiError(
            404,
            f"job {job_id!r} not found under prefix {log.keys.prefix!r}: the jobs page (/) "
            "and /api/jobs list the jobs there are",
        )
    return job_id
