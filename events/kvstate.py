"""Queryable state: registrations of keyed state with the JobManager's KvState registry.

``NotifyKvStateRegistered`` / ``NotifyKvStateUnregistered`` are Flink's messages (a task
tells the job's inbox where its state for a key-group range lives); the registry accepts
or refuses each, and records the accepted ones themselves as the job's facts, so the
KvStateLocation table is the fold of those facts. ``KvStateNotificationRefused`` records a
refusal (a clash, an unknown name, a range out of bounds ...) with a reason a person can act
on; ``DisposeJob`` asks the leader to release a finished job's queryable state, and
``JobDisposed`` records that it was released (the job's log stays).
"""

from __future__ import annotations

from dataclasses import field

from .schema import Event, event
from .types import KeyGroupRange

__all__ = [
    "NotifyKvStateRegistered",
    "NotifyKvStateUnregistered",
    "KvStateNotificationRefused",
    "DisposeJob",
    "JobDisposed",
]


@event("NotifyKvStateRegistered")
class NotifyKvStateRegistered(Event):
    """``state_id`` names the state instance (for Sluice: a Redis hash in the job's hash tag,
    ``Keys.kvstate``) and ``server_address`` the Redis that serves it (a URL without its
    password). ``execution_id`` is the registering attempt (``vertex:subtask:attempt``), so
    the registry can refuse a stale attempt and drop an attempt's state when it fails."""

    job_id: str
    vertex_id: str
    key_group_range: KeyGroupRange
    registration_name: str
    state_id: str
    server_address: str
    execution_id: str | None = None


@event("NotifyKvStateUnregistered")
class NotifyKvStateUnregistered(Event):
    """As a fact, ``state_ids`` are the state instances that lost key groups (filled in by
    the registry; the leader then deletes the ones no range points to any more)."""

    job_id: str
    vertex_id: str
    key_group_range: KeyGroupRange
    registration_name: str
    state_ids: list[str] = field(default_factory=list)


@event("KvStateNotificationRefused")
class KvStateNotificationRefused(Event):
    """Job fact: a (un)registration the registry refused; ``notification`` is its type."""

    job_id: str
    notification: str
    vertex_id: str
    registration_name: str
    reason: str


@event("DisposeJob")
class DisposeJob(Event):
    """To the cluster inbox: release an ended job's queryable state (its locations and the
    state the tasks left in Redis). ``reply_to`` gets ``JobDisposed`` or ``JobRefused``."""

    job_id: str
    reply_to: str


@event("JobDisposed")
class JobDisposed(Event):
    """Job fact (and the reply to ``DisposeJob``): every KvStateLocation of the job is gone.
    ``names`` were its registration names, ``state_ids`` the state instances deleted."""

    job_id: str
    names: list[str] = field(default_factory=list)
    state_ids: list[str] = field(default_factory=list)
