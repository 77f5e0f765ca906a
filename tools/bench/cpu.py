"""CPU time of processes while a bench runs, by role, from /proc: where the time goes.

A bench on a machine whose cores are all busy is bound by CPU, so the CPU each role spends
a task (the JobManager, the TaskManager, the workers, Redis) says where its time goes and
what a target allows, better than a wall clock. Linux only: elsewhere nothing is measured
(``CpuMeter.seconds`` stays empty).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType

__all__ = ["cpu_seconds", "CpuMeter"]

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds ``pid`` has used, all its threads (None when it is gone
    or there is no /proc)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


class CpuMeter:
    """``with CpuMeter({"Redis": lambda: [pid], ...}) as m:`` the CPU seconds each role used
    inside the block (``m.seconds``), and the block's wall time (``m.wall``). A role's
    processes are listed at the start and again at the end: one that started inside the
    block counts all its CPU, one that ended inside it counts nothing (measure before
    stopping them)."""

    def __init__(self, roles: Mapping[str, Callable[[], Iterable[int]]]) -> None:
        self.roles = roles
        self.seconds: dict[str, float] = {}
        self.wall = 0.0
        self._start: dict[str, dict[int, float]] = {}
        self._t = 0.0

    def _read(self) -> dict[str, dict[int, float]]:
        out: dict[str, dict[int, float]] = {}
        for role, pids in self.roles.items():
            out[role] = {pid: s for pid in pids() if (s := cpu_seconds(pid)) is not None}
        return out

    def __enter__(self) -> CpuMeter:
        self._start = self._read()
        self._t = time.perf_counter()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.wall = time.perf_counter() - self._t
        end = self._read()
        if not any(self._start.values()) and not any(end.values()):
            return  # no /proc: nothing measured
        self.seconds = {
            role: sum(s - self._start[role].get(pid, 0.0) for pid, s in end[role].items()) for role in self.roles
        }

    def per_task_ms(self, tasks: int) -> dict[str, float]:
        return {role: 1000 * s / tasks for role, s in self.seconds.items()}

    def cores_busy(self) -> float:
        return sum(self.seconds.values()) / self.wall if self.wall else 0.0
