"""Each TaskManager's temp directory, and the sweep of those whose TaskManager died.

A TaskManager keeps its tasks' temp files (split copies, staged outputs) under
``<home>/tmp/<resource id>/``. It removes each task's files when the task ends, but one
killed with SIGKILL removes nothing, and a new TaskManager has a new resource id: its
files would stay for good. So every TaskManager holds an exclusive ``flock`` on
``<home>/tmp/<resource id>.lock`` (beside its directory, which holds only its tasks'
files) for as long as it lives (the kernel lets go of it when the process dies, however
it dies), and sweeps the directories of the same home whose lock it can take: their
TaskManager is gone.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from pathlib import Path

__all__ = ["TempDir"]

_LOCK = ".lock"  # the suffix of a directory's lock file, beside it
_UNLOCKED_GRACE_S = 600.0
"""A directory without a lock file (a TaskManager of an earlier version, or one that died
between creating its directory and locking it) is swept only when older than this."""


class TempDir:
    def __init__(self, root: Path, resource_id: str) -> None:
        self.root = Path(root)
        self.path = self.root / resource_id
        self.lock = self.root / (resource_id + _LOCK)
        self._fd: int | None = None

    def claim(self, *, wait_s: float = 10.0) -> None:
        """Hold this TaskManager's lock until the process ends (a sweep that holds it for a
        moment is waited for; a live TaskManager with the same resource id is an error)."""
        lock = self.lock
        deadline = time.monotonic() + wait_s
        while True:
            self.root.mkdir(parents=True, exist_ok=True)  # (its own directory is made by its first task)
            fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{self.path} is in use by another live TaskManager with the same resource "
                        "id; give each TaskManager its own --resource-id"
                    ) from None
                time.sleep(0.1)
                continue
            try:  # the file locked must still be the one at the path (a sweep may have removed it)
                same = os.fstat(fd).st_ino == os.stat(lock).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._fd = fd
                return
            os.close(fd)

    @property
    def claimed(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """A TaskManager that stops leaves nothing: its lock file goes, and its directory when
        its tasks left it empty."""
        if self._fd is not None:
            self.lock.unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = None
            try:
                self.path.rmdir()
            except OSError:
                pass

    def sweep(self) -> list[Path]:
        """Remove the directories (and lock files) of dead TaskManagers under the same root;
        the directories removed."""
        removed = []
        try:
            names = {p.name[: -len(_LOCK)] if p.name.endswith(_LOCK) else p.name for p in self.root.iterdir()}
        except FileNotFoundError:
            return []
        for name in sorted(names - {self.path.name}):
            other, lock = self.root / name, self.root / (name + _LOCK)
            held = _take(other, lock)
            if held is None:
                continue
            try:  # removed while holding its lock: a TaskManager starting again under that id waits for us
                shutil.rmtree(other, ignore_errors=True)
                lock.unlink(missing_ok=True)
            finally:
                if held >= 0:
                    os.close(held)
            if not other.exists():
                removed.append(other)
        return removed


def _take(path: Path, lock: Path) -> int | None:
    """The lock of a dead TaskManager's directory, taken (its fd; -1 for an old directory
    without a lock file); None while its TaskManager lives."""
    try:
        fd = os.open(lock, os.O_RDWR)
    except FileNotFoundError:
        try:
            # The wall clock, as it must be: a file's mtime is the only stamp there is, and
            # the grace is ten minutes, far beyond an NTP step or a skew between hosts.
            return -1 if time.time() - path.stat().st_mtime > _UNLOCKED_GRACE_S else None
        except FileNotFoundError:
            return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None  # its TaskManager lives
    return fd
