"""What the leader holds in memory, and the phase of its leadership.

``LeaderState`` is replaced whole when the JobManager steps down or takes over (a reader on
another thread, the metrics endpoint, reads it once); the collaborators that outlive a
leadership (services/jobmanager/cluster.py, job_inboxes.py, retention.py) are given a
function that returns the current one, never the JobManager.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from sluice.services.coordination.runtime import JobCoordinators
from sluice.services.jobs.slot_memory import Memory as SlotReports
from sluice.services.jobs.state import JobsState
from sluice.services.jobs.timers import Timers
from sluice.services.membership.core import HeartbeatMonitor, Membership

__all__ = ["Phase", "LeaderState", "CurrentState"]


class Phase(str, Enum):
    """Where a JobManager is in its leadership: standing by, rebuilding from the log after
    taking the lease, or leading (serving; jobs left may still be rebuilt meanwhile)."""

    STANDBY = "standby"
    REPLAYING = "replaying"
    LEADING = "leading"

    def __str__(self) -> str:
        return self.value


@dataclass
class LeaderState:
    """What the leader holds in memory: folded from the log, plus soft state (liveness,
    coordinators)."""

    membership: Membership = field(default_factory=Membership)
    jobs: JobsState = field(default_factory=JobsState)
    monitor: HeartbeatMonitor = field(default_factory=HeartbeatMonitor)
    coords: dict[str, JobCoordinators] = field(default_factory=dict)
    reports: SlotReports = field(default_factory=SlotReports)
    """What the TaskManagers' slot reports showed lately (services/jobs/reconcile.py)."""
    timers: Timers = field(default_factory=Timers)
    """When slot waits and restart delays began, on this leader's clock (services/jobs/timers.py)."""


CurrentState = Callable[[], LeaderState]
"""The leader's state as it is now (it is replaced whole at a step down and a take-over)."""
