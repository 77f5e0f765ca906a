"""The coordinators' checkpoint interval on the leader's monotonic clock (services/coordination/runtime.py).

It ran on the wall clock the facts are stamped with: a leader whose clock stepped 10 s
back took no periodic checkpoint for 10 s more (a longer replay after a failover), and
one stepped forward took one at once.
"""

from __future__ import annotations

from sluice.services.coordination.runtime import JobCoordinators
from tests.cores import flushed
from tests.services.test_coordinators import JOB, DeterministicEcho, checkpoints, load, to_coordinator, user_vertex

INTERVAL_MS = 1_000
STEP_MS = 10_000


class Monotonic:
    def __init__(self) -> None:
        self.ms = 0

    def __call__(self) -> float:
        return self.ms / 1000


def _started(clock: Monotonic, wall: int) -> JobCoordinators:
    j = JobCoordinators(JOB, [user_vertex(DeterministicEcho)], {}, load, interval_ms=INTERVAL_MS, monotonic=clock)
    j.start(wall)
    assert checkpoints(flushed(j.flush(wall)))  # the first, at once
    j.feed(to_coordinator("op", 0, "a"))  # an input since: a checkpoint is due after the interval
    return j


def test_a_step_back_of_the_wall_clock_does_not_put_a_checkpoint_off() -> None:
    clock, wall = Monotonic(), 1_800_000_000_000
    j = _started(clock, wall)
    clock.ms += INTERVAL_MS
    assert [c.checkpoint_id for c in checkpoints(flushed(j.flush(wall + INTERVAL_MS - STEP_MS)))] == [1]


def test_a_step_forward_of_the_wall_clock_does_not_bring_a_checkpoint_early() -> None:
    clock, wall = Monotonic(), 1_800_000_000_000
    j = _started(clock, wall)
    clock.ms += INTERVAL_MS // 10
    assert checkpoints(flushed(j.flush(wall + STEP_MS))) == []
    clock.ms += INTERVAL_MS
    assert [c.checkpoint_id for c in checkpoints(flushed(j.flush(wall + STEP_MS + INTERVAL_MS)))] == [1]
