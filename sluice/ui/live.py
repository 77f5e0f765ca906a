"""Server-sent events that follow the log: ``GET /api/jobs/{id}/events``.

One stream per open page. It reads the job's fact stream with a blocking read (through
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
from collections.abc import AsyncIterator
from functools import partial

import anyio
import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from sluice.errors import RedisUnavailable
from sluice.store import EventLog

from .params import known_job

__all__ = ["job_events", "BLOCK_MS"]

BLOCK_MS = 1000
"""How long one read blocks when nothing happens (and so how soon a closed page is noticed)."""

_ENTRY = re.compile(r"^\d+-\d+$")
_READERS = anyio.CapacityLimiter(64)
"""Blocked reads wait in threads of their own allowance, not the JSON endpoints'."""


def _event(entry: str, new: int) -> bytes:
    data = orjson.dumps({"entry": entry, "new": new}).decode()
    return f"id: {entry}\nevent: changed\ndata: {data}\n\n".encode()


async def job_events(request: Request) -> Response:
    """Server-sent events: one "changed" event (with the entry id it reached) per batch of new facts of the
    job; the first names the last entry at connection time. Resumes after Last-Event-ID."""
    log: EventLog = request.app.state.log
    job_id = request.path_params["job_id"]
    stream = log.keys.facts(log.keys.job(job_id))
    last = await anyio.to_thread.run_sync(lambda: log.last_id(stream))
    if last is None:
        known_job(log, job_id)  # raises the 404
    resume = request.headers.get("last-event-id", "")
    start = resume if _ENTRY.match(resume) else None
    stopping = request.app.state.stopping

    async def events() -> AsyncIterator[bytes]:
        pos = start or last or "0-0"
        yield b"retry: 2000\n\n"
        if start is None:
            yield _event(pos, 0)
        while not stopping.is_set():
            read = partial(log.follow, {stream: pos}, block_ms=BLOCK_MS, count=10_000)
            try:
                got = await anyio.to_thread.run_sync(read, limiter=_READERS)
            except RedisUnavailable as exc:  # say so and end: the browser reconnects after `retry`
                yield f"event: unavailable\ndata: {orjson.dumps({'error': str(exc)}).decode()}\n\n".encode()
                return
            if got:
                pos = got[-1][1]
                yield _event(pos, len(got))
            else:
                yield b": waiting\n\n"

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
