"""The simulated world's clock and ids: everything a shell takes from outside, seeded."""

from __future__ import annotations

import random

__all__ = ["ProcessClock", "SimWorld"]


class SimWorld:
    """A clock the scheduler moves between steps, and ids drawn from the seed.

    Within a step the clock also creeps, as a real one does while a process works: a read
    of it moves it on by a millisecond now and then (``creep``: how often). Two reads in
    one step may so differ, and code that stamps a fact with one and folds it with the
    other is caught."""

    def __init__(self, rng: random.Random, start_ms: int = 1_800_000_000_000, *, creep: float = 0.25) -> None:
        self.rng = rng
        self.now = start_ms
        self.start = start_ms
        self.creep = creep
        self._creep_rng = random.Random(rng.getrandbits(64))

    def now_ms(self) -> int:
        if self.creep and self._creep_rng.random() < self.creep:
            self.now += 1
        return self.now

    def monotonic(self) -> float:
        return (self.now - self.start) / 1000.0

    def new_id(self) -> str:
        return f"{self.rng.getrandbits(128):032x}"

    def advance(self, ms: int) -> None:
        self.now += max(0, ms)

    @property
    def elapsed_ms(self) -> int:
        return self.now - self.start


class ProcessClock:
    """One host's clocks (the ``clock_skew`` fault): its wall clock is off the world's by
    ``offset_ms``, which steps forwards and backwards now and then (an NTP correction);
    its monotonic clock counts from its own boot and never goes back. Ids come from the
    world's seeded stream, as before."""

    def __init__(self, world: SimWorld, offset_ms: int, boot_s: float) -> None:
        self.world, self.offset_ms, self.boot_s = world, offset_ms, boot_s

    def now_ms(self) -> int:
        return self.world.now_ms() + self.offset_ms

    def monotonic(self) -> float:
        return self.world.monotonic() + self.boot_s

    def new_id(self) -> str:
        return self.world.new_id()
