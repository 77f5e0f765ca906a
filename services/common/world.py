"""What a shell takes from the world outside its logic: the clock and fresh ids.

Cores never read a clock or draw randomness; shells do, through a ``World``. Real
processes use :data:`SYSTEM`; the simulation passes one whose clock is simulated and
whose ids come from the seed, so a run replays exactly.
"""

from __future__ import annotations

import os
import time
from typing import Protocol

__all__ = ["World", "SystemWorld", "SYSTEM", "monotonic_ms"]


class World(Protocol):
    def now_ms(self) -> int:
        """Wall-clock milliseconds (event times; a timeout within one process runs on
        ``monotonic``: the wall clock steps when NTP corrects it)."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back: what every timeout and schedule of a
        shell runs on (``monotonic_ms``), and stall detection."""

    def new_id(self) -> str:
        """A fresh unique id (32 hex digits)."""


def monotonic_ms(world: World) -> int:
    """``world``'s monotonic clock in milliseconds: what timeouts measured within one
    process run on (its wall clock may step back or forward, as NTP corrects it)."""
    return round(world.monotonic() * 1000)


class SystemWorld:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()

    def new_id(self) -> str:
        # 128 random bits (a uuid4's entropy at a third of its cost: ids are made for every event)
        return os.urandom(16).hex()


SYSTEM = SystemWorld()
