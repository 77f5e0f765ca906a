"""Cluster membership: the pure core (``core``), and the JobManager/TaskManager shells use it."""

from .core import (
    Decision,
    HeartbeatMonitor,
    Inbound,
    Membership,
    MembershipConfig,
    TaskManagerRow,
    Timeouts,
    decide,
    evolve,
)

__all__ = [
    "Decision",
    "HeartbeatMonitor",
    "Membership",
    "MembershipConfig",
    "TaskManagerRow",
    "Inbound",
    "Timeouts",
    "decide",
    "evolve",
]
