"""Small builders the tests share."""

from __future__ import annotations

import itertools

from sluice.events import PROTOCOL_VERSION, Envelope, Event, RegisterTaskManager, TaskManagerHeartbeat

_ids = itertools.count(1)


def env(
    event: Event, *, epoch: int = 0, ts: int = 1_700_000_000_000, job: str | None = None, cause: str | None = None
) -> Envelope:
    return Envelope(event, f"id-{next(_ids)}", epoch, ts, job, cause)


def register(
    rid: str = "tm-1",
    session: str = "s1",
    *,
    slots: int = 2,
    epoch: int = 1,
    host: str = "host-a",
    protocol: int = PROTOCOL_VERSION,
) -> RegisterTaskManager:
    return RegisterTaskManager(rid, session, host, slots, protocol, epoch)


def heartbeat(rid: str = "tm-1", session: str = "s1", epoch: int = 1) -> TaskManagerHeartbeat:
    return TaskManagerHeartbeat(rid, session, epoch, 0)
