"""Processes as Linux shows them in /proc: alive or not, children, command lines.

No psutil: what the suite needs (a pid's parent, state and argv) is three reads of /proc.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "Ident",
    "ident",
    "same",
    "alive",
    "argv",
    "children",
    "descendants",
    "kill",
    "wait_gone",
    "workers_of",
    "find",
    "option",
]


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, parent pid), or None when the process is gone."""
    fields = _fields(pid)
    return (fields[0], int(fields[1])) if fields else None


def _fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw.rsplit(")", 1)[1].split()


Ident = tuple[int, int]
"""(pid, start time in clock ticks since boot): names one process even after its pid is reused."""


def ident(pid: int) -> Ident | None:
    fields = _fields(pid)
    return (pid, int(fields[19])) if fields else None


def same(who: Ident) -> bool:
    """``who`` still runs (its pid was not reused by another process since)."""
    return alive(who[0]) and ident(who[0]) == who


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (a zombie child of ours is reaped here)."""
    st = _stat(pid)
    if st is None:
        return False
    if st[0] == "Z":
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        return False
    return True


def argv(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _all() -> list[int]:
    return [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit()]


def children(pid: int) -> list[int]:
    found = []
    for p in _all():
        st = _stat(p)
        if st is not None and st[1] == pid and st[0] != "Z":
            found.append(p)
    return sorted(found)


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = [pid]
    while todo:
        for c in children(todo.pop()):
            out.append(c)
            todo.append(c)
    return out


def workers_of(tm_pid: int) -> list[int]:
    """A TaskManager's slot workers: its children running ``sluice ... worker`` (a worker's
    guard execs into the worker, so the worker is the TaskManager's own child)."""
    return [c for c in children(tm_pid) if "worker" in argv(c) and "sluice.services.common.guard" not in argv(c)]


def find(match: Callable[[list[str]], bool]) -> list[int]:
    """Live processes (not this one) whose argv ``match`` accepts."""
    me = os.getpid()
    return sorted(p for p in _all() if p != me and (args := argv(p)) and match(args) and alive(p))


def option(args: list[str], flag: str) -> str | None:
    """The value after ``flag`` in ``args`` (None when it is not there)."""
    return args[args.index(flag) + 1] if flag in args[:-1] else None


def kill(pid: int, sig: int = signal.SIGKILL) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """The pids still alive after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in pids if alive(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)
