"""What a run of the simulation is given (``SimConfig``), what it yields (``Outcome``), the
cluster's timings, and where the simulated hosts keep their files."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sluice.services.jobs.speculation_config import SpeculationConfig

from .faults import Faults

__all__ = ["HEARTBEAT_MS", "LEASE_MS", "TIMEOUT_MS", "SPECULATION", "Outcome", "SimConfig", "base"]

HEARTBEAT_MS = 100
TIMEOUT_MS = 1000
LEASE_MS = 600
_BASE: Path | None = None
SPECULATION = SpeculationConfig(enabled=True, baseline_ratio=0.5, baseline_lower_bound_ms=50, check_interval_ms=50)
"""The JobManagers' speculation with ``SimConfig.speculation``: simulated tasks take tens of ms."""


def base() -> Path:
    """The folder of this process's runs (each seed's TaskManagers' disks are a folder in it)."""
    global _BASE
    if _BASE is None:
        shm = Path("/dev/shm")  # memory, where there is one: the TaskManagers' files cost no disk I/O
        _BASE = Path(
            tempfile.mkdtemp(prefix="sluice-sim-", dir=shm if shm.is_dir() and os.access(shm, os.W_OK) else None)
        )
    return _BASE


@dataclass
class SimConfig:
    seed: int
    fault_steps: int = 1200
    settle_ms: int = 120_000
    """After faults stop, every job must end within this much simulated time."""
    faults: Faults | None = None
    """None: drawn from the seed (swarm)."""
    check_every: int = 50
    jobmanagers: int | None = None
    taskmanagers: int | None = None
    jobs: int | None = None
    max_stall_s: float = 5.0
    """The JobManagers' stall limit (a replay step or a read is progress)."""
    replay_page: int | None = None
    """Facts a new leader replays per step (None: drawn from the seed)."""
    speculation: bool = False
    """Speculative execution on in the JobManagers, and one TaskManager 5x slower (drawn from a
    stream of its own when ``slow_reader`` did not pick one: the seed's other draws stay)."""
    serve_after_s: float | None | str = "seed"
    """A new leader's rebuild time before it serves while rebuilding the jobs left ("seed":
    drawn from the seed; None: it serves only once every job is rebuilt)."""
    shards: int = 1
    """The log's masters (a Redis Cluster: tags spread over them by slot, store/shards.py). With
    more than one, the ``shard_failover`` fault is on (faults.SHARD_KINDS) and no restart of
    the log keeps every write (a failover loses what the replica had not received)."""


@dataclass
class Outcome:
    seed: int
    ok: bool
    violation: str | None
    steps: int
    sim_ms: int
    facts: int
    faults: list[str]
    jobs: dict[str, str]
    trace: str = ""
    speculated: int = 0
    """Speculative attempts started (with ``SimConfig.speculation``)."""
    raced: int = 0
    """Races decided: a subtask's attempts, one won and the others were cancelled."""
