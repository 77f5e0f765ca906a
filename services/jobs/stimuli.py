"""What the jobs core is asked to decide (``core.decide``): one small frozen dataclass per
kind of stimulus, each with what its rules need besides the state and the time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sluice.events import Envelope, SubmitJob

from .speculation_config import SpeculationConfig
from .timers import Timers

__all__ = [
    "JobsConfig",
    "FreeSlots",
    "Submit",
    "Inbound",
    "Schedule",
    "FailAtOnce",
    "TaskManagerGone",
    "Orphans",
    "LogRestart",
    "SlotWaits",
    "Stimulus",
]

FreeSlots = dict[str, list[int]]
"""Free slots per registered TaskManager."""


@dataclass(frozen=True)
class JobsConfig:
    slot_timeout_ms: int = 300_000
    deploy_timeout_ms: int = 60_000
    """An attempt DEPLOYING this long, not held by its TaskManager, fails (services/jobs/reconcile.py)."""
    speculation: SpeculationConfig = SpeculationConfig()
    """Speculative execution (services/jobs/speculation.py): off by default."""


@dataclass(frozen=True)
class Submit:
    """Accept a validated job: record it and build its ExecutionGraph (every subtask's first
    attempt numbered ``first_attempt``: the cluster's attempt floor)."""

    msg: SubmitJob
    splits: dict[str, list[Any]]
    storage_root: str
    first_attempt: int = 0


@dataclass(frozen=True)
class Inbound:
    """A message from the job's inbox (a TaskManager's, a subtask's or a client's)."""

    job_id: str
    env: Envelope
    config: JobsConfig


@dataclass(frozen=True)
class Schedule:
    """Deploy the job's ready executions onto ``free`` slots (taken from as slots are
    assigned); ``sessions`` names each TaskManager's current registration. A restarted
    attempt waits out its delay on the leader's monotonic ``clock`` (``timers``); without
    ``timers`` (the core on its own, one clock for everything) on ``now``."""

    job_id: str
    free: FreeSlots
    sessions: dict[str, str] | None = None
    timers: Timers | None = None
    clock: int = 0


@dataclass(frozen=True)
class FailAtOnce:
    """Fail a job at once, without restarts (a coordinator failed): cancel its tasks."""

    job_id: str
    reason: str


@dataclass(frozen=True)
class TaskManagerGone:
    """Every execution on a lost TaskManager (``session``: only on that registration of it)
    fails, and may be restarted elsewhere."""

    resource_id: str
    reason: str
    config: JobsConfig
    session: str | None = None


@dataclass(frozen=True)
class Orphans:
    """Executions placed on a TaskManager registration that is gone fail. ``active``:
    resource id -> current session; ``registered``: resource id -> the epoch its current
    registration began at; ``reasons``: why each one that is gone went."""

    active: dict[str, str]
    reasons: dict[str, str]
    config: JobsConfig
    registered: dict[str, int] | None = None


@dataclass(frozen=True)
class LogRestart:
    """The log's server restarted and may have lost its last writes: unfinished attempts run
    again, numbered at least ``attempt_floor``."""

    reason: str
    attempt_floor: int


@dataclass(frozen=True)
class SlotWaits:
    """Time passed: jobs that waited too long for slots fail (see ``losses.slot_waits``)."""

    config: JobsConfig
    total_slots: int
    since: int = 0
    timers: Timers | None = None
    clock: int = 0


Stimulus = Submit | Inbound | Schedule | FailAtOnce | TaskManagerGone | Orphans | LogRestart | SlotWaits
