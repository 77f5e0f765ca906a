"""The settings of speculative execution (services/jobs/speculation.py), on their own: the
JobManager's configuration builds them without importing the jobs core."""

from __future__ import annotations

import re
from dataclasses import dataclass

from sluice.errors import ConfigError

__all__ = ["SpeculationConfig", "FORMS"]

FORMS = (
    "give 'off' (the default), 'on' (slow past 1.5 x its vertex's median execution time, and at "
    "least 60000 ms), or a multiplier of 1 or more and milliseconds, e.g. '2,30000'"
)
"""The forms ``SpeculationConfig.parse`` reads, as an error message tells them."""


@dataclass(frozen=True)
class SpeculationConfig:
    """When a subtask gets a speculative attempt (see the module's docstring)."""

    enabled: bool = False
    baseline_ratio: float = 0.75
    baseline_multiplier: float = 1.5
    baseline_lower_bound_ms: int = 60_000
    max_concurrent: int = 2
    check_interval_ms: int = 1_000
    """How often the leader looks for slow attempts (Flink's ``slow-task-detector.check-interval``)."""

    def __post_init__(self) -> None:
        if not 0 < self.baseline_ratio <= 1:
            raise ConfigError(
                f"speculation baseline_ratio {self.baseline_ratio!r} is not a share of a vertex's subtasks: "
                "give a number in (0, 1] (Flink's default: 0.75)"
            )
        if not self.baseline_multiplier >= 1:
            raise ConfigError(
                f"speculation baseline_multiplier {self.baseline_multiplier!r} would call an attempt slow "
                "before the median: give a number >= 1 (Flink's default: 1.5)"
            )
        if self.baseline_lower_bound_ms < 0:
            raise ConfigError(
                f"speculation baseline_lower_bound_ms {self.baseline_lower_bound_ms!r} is negative: "
                "give milliseconds >= 0 (Flink's default: 60000)"
            )
        if self.max_concurrent < 2:
            raise ConfigError(
                f"speculation max_concurrent {self.max_concurrent!r} leaves no room for a speculative "
                "attempt: give 2 or more (Flink's default: 2), or turn speculation off"
            )

    @classmethod
    def parse(cls, text: str | None, *, where: str = "speculation") -> SpeculationConfig:
        """``off`` (or nothing), ``on`` (Flink's defaults), or ``X,MS``: on, slow past ``X``
        times the median and at least ``MS`` milliseconds."""
        value = (text or "off").strip().lower()
        if value in ("off", "false", "0"):
            return cls()
        if value in ("on", "true", "1"):
            return cls(enabled=True)
        m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*,\s*(\d+)", value)
        if m and float(m.group(1)) >= 1:
            return cls(enabled=True, baseline_multiplier=float(m.group(1)), baseline_lower_bound_ms=int(m.group(2)))
        raise ConfigError(f"{where} = {text!r} is not a speculation setting: {FORMS}")
