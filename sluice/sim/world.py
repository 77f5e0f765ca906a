"""The simulated world's clock and ids: everything a shell takes from outside, seeded."""

from __future__ import annotations

import random

__all__ = ["SimWorld"]


class SimWorld:
    """A clock that moves only when the scheduler moves it, and ids drawn from the seed."""

    def __init__(self, rng: random.Random, start_ms: int = 1_800_000_000_000) -> None:
        self.rng = rng
        self.now = start_ms
        self.start = start_ms

    def now_ms(self) -> int:
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
