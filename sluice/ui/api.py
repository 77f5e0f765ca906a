"""The dashboard's JSON endpoints: each is a view of ``sluice.views`` (the same data
``sluice inspect ... --json`` prints) at ``?at=`` (an entry id, milliseconds or an ISO time;
now when absent).

Handlers are plain functions: Starlette runs them in its thread pool, where they may read
Redis (through ``store/``) without holding up the event loop. Each handler's docstring is
its OpenAPI summary (first line) and description; ``@query`` names its query parameters.
"""

from __future__ import annotations

import math

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .errors import ApiError
from .params import AT, at_of, known_job, log_of, query

__all__ = ["routes"]


@query(at=AT)
def list_jobs(request: Request) -> Response:
    """Every job: state, duration, tasks done out of the total."""
    from sluice.views.jobs import jobs

    return JSONResponse(jobs(log_of(request), at_of(request)))


def _count(request: Request, name: str, example: int) -> int | None:
    """A ``?name=N`` count (None when absent); anything but a whole number is a 400."""
    raw = request.query_params.get(name)
    if raw is not None and not raw.isdigit():
        raise ApiError(
            400,
            f"{name}={raw!r} is not a count of {name}: send a whole number like {name}={example}, "
            "or leave it out for all of them",
        )
    return None if raw is None else int(raw)


@query(
    at=AT,
    events="Only the last N events (absent: all of them). ``entries`` always lists every fact entry.",
    attempts="Only the N attempts that started last, in the usual order (absent: all of them); "
    "``attempts_total`` then says how many there are.",
)
def job_timeline(request: Request) -> Response:
    """One job's timeline: its events, every attempt (TaskManager, slot, splits, durations), the root
    cause with the user's traceback, restarts, and the ids of its fact entries (the time slider's stops)."""
    from sluice.views.timeline import timeline

    log = log_of(request)
    events, attempts = _count(request, "events", 200), _count(request, "attempts", 500)
    tl = timeline(log, known_job(log, request.path_params["job_id"]), at_of(request))
    if events is not None:
        tl["events"] = tl["events"][len(tl["events"]) - events :] if events < len(tl["events"]) else tl["events"]
    if attempts is not None:
        tl["attempts_total"] = len(tl["attempts"])
        latest = (
            sorted(range(len(tl["attempts"])), key=lambda i: tl["attempts"][i]["states"][0]["at"])[-attempts:]
            if attempts
            else []
        )
        tl["attempts"] = [tl["attempts"][i] for i in sorted(latest)]
    return JSONResponse(tl)


@query(at=AT)
def job_graph(request: Request) -> Response:
    """One job's ExecutionGraph: vertices with their parallelism, per-state counts and status; edges
    with their exchange kind."""
    from sluice.views.graph import graph

    log = log_of(request)
    return JSONResponse(graph(log, known_job(log, request.path_params["job_id"]), at_of(request)))


@query(at=AT)
def job_kvstate(request: Request) -> Response:
    """One job's KvStateLocation table: registration name -> vertex, key-group ranges, state ids
    and servers."""
    from sluice.views.kvstate import kvstate

    log = log_of(request)
    return JSONResponse(kvstate(log, known_job(log, request.path_params["job_id"]), at_of(request)))


@query(at=AT)
def list_taskmanagers(request: Request) -> Response:
    """Every TaskManager with its slots and its last heartbeat."""
    from sluice.views.taskmanagers import taskmanagers

    return JSONResponse(taskmanagers(log_of(request), at_of(request)))


@query(window="Seconds of the log the event counts and rates cover (default 60).")
def cluster_stats(request: Request) -> Response:
    """Streams (length, memory), event counts and rates by type, consumer groups with their lag and
    pending entries, dead letters by reason."""
    from sluice.views.stats import stats

    raw = request.query_params.get("window", "60")
    try:
        window = float(raw)
        if not (math.isfinite(window) and window > 0):
            raise ValueError
    except ValueError:
        raise ApiError(400, f"window={raw!r} is not a number of seconds above 0 (like window=60)") from None
    return JSONResponse(stats(log_of(request), window))


def routes() -> list[Route]:
    return [
        Route("/api/jobs", list_jobs),
        Route("/api/jobs/{job_id}", job_timeline),
        Route("/api/jobs/{job_id}/graph", job_graph),
        Route("/api/jobs/{job_id}/kvstate", job_kvstate),
        Route("/api/taskmanagers", list_taskmanagers),
        Route("/api/stats", cluster_stats),
    ]
