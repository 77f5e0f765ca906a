"""The kinds of fault the chaos suite strikes with, and a run's seeded plan of strikes."""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import Enum

__all__ = ["Kind", "Strike", "plan", "fsync_policy"]


class Kind(str, Enum):
    LEADER_KILL = "leader-kill"
    """kill -9 of the leading JobManager (a standby runs; a new standby is started after)."""
    TM_KILL = "tm-kill"
    """kill -9 of a TaskManager (its workers die with it; a new TaskManager is started)."""
    WORKER_KILL = "worker-kill"
    """kill -9 of one slot's RQ worker process (its TaskManager replaces it)."""
    REDIS_RESTART = "redis-restart"
    """kill -9 of redis-server, then a restart on the same port and data directory."""
    TM_STOP = "tm-stop"
    """SIGSTOP of a TaskManager past its heartbeat timeout, then SIGCONT."""
    LEADER_STOP = "leader-stop"
    """SIGSTOP of the leading JobManager past its lease (a standby takes over), then SIGCONT."""


KINDS: tuple[Kind, ...] = tuple(Kind)


@dataclass(frozen=True)
class Strike:
    kind: Kind
    delay_s: float
    """How long after the job is running (and the last strike recovered) to strike."""
    pick: float
    """Chooses the target among the candidates (a TaskManager, a worker), in [0, 1)."""
    pause_s: float
    """Redis: how long it stays down. Otherwise unused."""


def plan(seed: int, kills: int) -> list[Strike]:
    """The strikes of the run with this seed. Their kinds are ``kills`` consecutive kinds of a
    fixed cycle, starting where the seed says and shuffled: consecutive seeds cover every kind
    evenly (a campaign of runs S, S+1, ... strikes each kind about as often), and one seed
    alone replays its run."""
    rng = random.Random(seed)
    start = (seed * kills) % len(KINDS)
    kinds = [KINDS[(start + i) % len(KINDS)] for i in range(kills)]
    rng.shuffle(kinds)
    return [Strike(k, round(rng.uniform(0.5, 4.0), 2), rng.random(), round(rng.uniform(0.2, 2.5), 2)) for k in kinds]


def fsync_policy(seed: int) -> str:
    """The run's Redis fsync policy: alternating with the seed, so a campaign covers both."""
    return "always" if seed % 2 == 0 else "everysec"
