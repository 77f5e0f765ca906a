"""The kinds of fault the campaign across hosts inflicts, and each run's seeded plan: one
fault per run, its kind ``KINDS[seed % 6]`` (consecutive seeds cover the kinds evenly), its
target host and its sizes drawn from the seed (one seed alone replays its run)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import Enum

__all__ = ["HostKind", "HostStrike", "KINDS", "plan"]


class HostKind(str, Enum):
    TM_CUT = "tm-cut"
    """A TaskManager host's link down past the heartbeat timeout, then up: declared lost, its
    tasks move; healed, it registers afresh and its late reports are refused."""
    JM_CUT = "jm-cut"
    """The leading JobManager's host cut off (from Redis and all) past its lease: the standby
    takes over; reachable again, the old leader is refused."""
    DROP = "drop"
    """10-30 % of packets dropped at random on one host's link for 20 s."""
    LATENCY = "latency"
    """50-200 ms each way on one host's Redis traffic, through its delay proxy, for 20 s."""
    SKEW = "skew"
    """One host's wall clock 30 s ahead or behind (faketime) for the whole run."""
    HOST_KILL = "host-kill"
    """kill -9 of every process of a TaskManager host, then its processes started again."""


KINDS: tuple[HostKind, ...] = tuple(HostKind)


@dataclass(frozen=True)
class HostStrike:
    kind: HostKind
    target: str
    """The host struck (``tm1``...; ``leader`` for JM_CUT, and for DROP on the leader's host)."""
    delay_s: float
    """From the job's first task running to the strike."""
    hold_s: float
    """How long the fault lasts (the cut, the loss, the latency; a killed host stays down)."""
    loss: float = 0.0
    """DROP: the probability a packet is dropped."""
    latency_ms: tuple[int, int] = (0, 0)
    """LATENCY: the delay range, each way."""
    offset: str = ""
    """SKEW: the faketime offset of the target's clock."""

    def describe(self) -> str:
        extra = {
            HostKind.DROP: f" {self.loss:.0%} loss",
            HostKind.LATENCY: f" {self.latency_ms[0]}-{self.latency_ms[1]} ms",
            HostKind.SKEW: f" clock {self.offset}",
        }.get(self.kind, "")
        hold = "" if self.kind is HostKind.SKEW else f" for {self.hold_s:.1f} s"
        return f"{self.kind.value} of {self.target}{extra}{hold}"


def plan(seed: int, *, taskmanagers: int, heartbeat_timeout_s: float, lease_ttl_s: float) -> HostStrike:
    """The fault of the run with this seed, on a cluster of ``taskmanagers`` TaskManager hosts
    whose timeouts are those given (a cut outlasts them by 2-5 s)."""
    if taskmanagers < 2:
        raise ValueError(
            f"{taskmanagers} TaskManager host(s): the campaign needs at least 2, so that "
            "the job runs on two hosts and a struck host's tasks can move"
        )
    rng = random.Random(seed)
    kind = KINDS[seed % len(KINDS)]
    tms = [f"tm{i + 1}" for i in range(taskmanagers)]
    delay = round(rng.uniform(1.0, 4.0), 1)
    if kind is HostKind.TM_CUT:
        return HostStrike(kind, rng.choice(tms), delay, round(heartbeat_timeout_s + rng.uniform(2.0, 5.0), 1))
    if kind is HostKind.JM_CUT:
        return HostStrike(kind, "leader", delay, round(lease_ttl_s + rng.uniform(2.0, 5.0), 1))
    if kind is HostKind.DROP:
        return HostStrike(kind, rng.choice([*tms, "leader"]), delay, 20.0, loss=round(rng.uniform(0.1, 0.3), 2))
    if kind is HostKind.LATENCY:
        low = rng.randint(50, 150)
        return HostStrike(kind, rng.choice([*tms, "jm1"]), delay, 20.0, latency_ms=(low, rng.randint(low, 200)))
    if kind is HostKind.SKEW:
        return HostStrike(kind, rng.choice([*tms, "jm1", "jm2"]), delay, 0.0, offset=rng.choice(["+30s", "-30s"]))
    return HostStrike(kind, rng.choice(tms), delay, round(rng.uniform(1.0, 4.0), 1))
