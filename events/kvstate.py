"""Queryable state: registrations of keyed state with the JobManager's KvState registry."""

from __future__ import annotations

from .schema import Event, event
from .types import KeyGroupRange

__all__ = ["NotifyKvStateRegistered", "NotifyKvStateUnregistered"]


@event("NotifyKvStateRegistered")
class NotifyKvStateRegistered(Event):
    job_id: str
    vertex_id: str
    key_group_range: KeyGroupRange
    registration_name: str
    state_id: str
    server_address: str


@event("NotifyKvStateUnregistered")
class NotifyKvStateUnregistered(Event):
    job_id: str
    vertex_id: str
    key_group_range: KeyGroupRange
    registration_name: str
