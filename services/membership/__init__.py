"""Cluster membership: the pure core (``core``), and the JobManager/TaskManager shells use it."""

from .core import (
    Decision,
    HeartbeatMonitor,
    Membership,
    MembershipConfig,
    TaskManagerRow,
    decide,
    decide_timeouts,
    evolve,
)

__all__ = [
    "Decision",
    "HeartbeatMonitor",
    "Membership",
    "MembershipConfig",
    "TaskManagerRow",
    "decide",
    "decide_timeouts",
    "evolve",
]
