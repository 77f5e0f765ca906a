"""Server-sent events that follow the log: ``GET /api/jobs/{id}/events`` for a job page (the
job's fact stream), ``GET /api/events`` for the jobs and TaskManagers pages (the cluster's
facts and every registered job's).

One stream per open page. It reads its fact streams with a blocking read (through
``store/``: ``EventLog.follow``) and sends one small event per batch of new entries::

    id: 1763870000000-3
    event: changed
    data: {"entry": "1763870000000-3", "new": 2}

The first event is sent at once and names the stream's last entry, so a page fetches its
data in answer to it and misses nothing that happened between loading and subscribing.
The page then fetches the JSON once per event (and coalesces events that arrive while it
fetches): no polling. A reconnecting browser sends ``Last-Event-ID`` and resumes after it.
Between batches a comment line goes out every second, which is how a closed page is
noticed and its stream ended. When Redis goes away the stream says so (``event:
unavailable``, ``data: {"error": ...}``) and ends; the browser reconnects by itself.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from functools import partial

import anyio
import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from sluice.errors import RedisUnavailable
from sluice.store import EventLog, entry_order
from sluice.views.history import cluster_at

from .params import known_job

__all__ = ["job_events", "cluster_events", "BLOCK_MS"]

BLOCK_MS = 1000
"""How long one read blocks when nothing happens (and so how soon a closed page is noticed)."""

_ENTRY = re.compile(r"^\d+-\d+$")
_READERS = anyio.CapacityLimiter(64)
"""Blocked reads wait in threads of their own allowance, not the JSON endpoints'."""


def _event(entry: str, new: int) -> bytes:
    data = orjson.dumps({"entry": entry, "new": new}).decode()
    return f"id: {entry}\nevent: changed\ndata: {data}\n\n".encode()


def _latest(ids: list[str]) -> str:
    return max(ids, key=entry_order, default="0-0")


def _stream(request: Request, streams: Callable[[], list[str]], grows_on: str | None = None) -> Response:
    """Follow ``streams()`` (asked again after each new entry of ``grows_on``: a new job's
    facts join the cluster's page). Entry ids are Redis's clock, so one id resumes them all."""
    log: EventLog = request.app.state.log
    stopping = request.app.state.stopping
    resume = request.headers.get("last-event-id", "")
    start = resume if _ENTRY.match(resume) else None

    def positions(known: dict[str, str], since: str | None = None) -> dict[str, str]:
        """Where to read each stream from: where it was; for a stream that joins later, after
        ``since`` (the entry that made it join: none of its facts are missed)."""
        return {s: known.get(s) or since or start or log.last_id(s) or "0-0" for s in streams()}

    async def events() -> AsyncIterator[bytes]:
        yield b"retry: 2000\n\n"
        try:
            pos = await anyio.to_thread.run_sync(positions, {}, limiter=_READERS)
            if start is None:
                yield _event(_latest(list(pos.values())), 0)
            while not stopping.is_set():
                got = await anyio.to_thread.run_sync(
                    partial(log.follow, pos, block_ms=BLOCK_MS, count=10_000), limiter=_READERS
                )
                if not got:
                    yield b": waiting\n\n"
                    continue
                for stream, entry_id, _ in got:
                    pos[stream] = entry_id
                grew = [entry_id for stream, entry_id, _ in got if stream == grows_on]
                if grew:
                    since = min(grew, key=entry_order)
                    pos = await anyio.to_thread.run_sync(positions, pos, since, limiter=_READERS)
                yield _event(_latest([entry_id for _, entry_id, _ in got]), len(got))
        except RedisUnavailable as exc:  # say so and end: the browser reconnects after `retry`
            yield f"event: unavailable\ndata: {orjson.dumps({'error': str(exc)}).decode()}\n\n".encode()

    return StreamingResponse(
        events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )


async def job_events(request: Request) -> Response:
    """Server-sent events: one "changed" event (with the entry id it reached) per batch of new facts of the
    job; the first names the last entry at connection time. Resumes after Last-Event-ID."""
    log: EventLog = request.app.state.log
    job_id = request.path_params["job_id"]
    await anyio.to_thread.run_sync(known_job, log, job_id)  # a 404 before the stream starts
    stream = log.keys.facts(log.keys.job(job_id))
    return _stream(request, lambda: [stream])


async def cluster_events(request: Request) -> Response:
    """Server-sent events: one "changed" event per batch of new facts of the cluster or of any job it has
    registered (the jobs and TaskManagers pages refetch on each). Resumes after Last-Event-ID."""
    log: EventLog = request.app.state.log
    cluster = log.keys.facts(log.keys.cluster)

    def streams() -> list[str]:
        return [cluster, *(log.keys.facts(log.keys.job(j)) for j in cluster_at(log).jobs)]

    return _stream(request, streams, grows_on=cluster)
