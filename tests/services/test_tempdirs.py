"""A TaskManager's temp directory: held by a lock while it lives, swept by the others of its
home once it died (however it died), never while it lives."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sluice.services.taskmanager.tempdirs import TempDir

HOLD = """
import sys, time
from pathlib import Path
from sluice.services.taskmanager.tempdirs import TempDir
t = TempDir(Path(sys.argv[1]), sys.argv[2]); t.claim()
t.path.mkdir(); (t.path / "split-0.txt").write_text("left behind")
print("claimed", flush=True); time.sleep(60)
"""


def holder(root: Path, rid: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(root), rid], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "claimed"
    return proc


def test_a_killed_taskmanagers_files_are_swept_and_a_live_ones_never(tmp_path: Path) -> None:
    live, dead = holder(tmp_path, "tm-live"), holder(tmp_path, "tm-dead")
    try:
        dead.send_signal(signal.SIGKILL)
        dead.wait()
        me = TempDir(tmp_path, "tm-me")
        me.claim()
        assert me.sweep() == [tmp_path / "tm-dead"]
        assert not (tmp_path / "tm-dead").exists() and not (tmp_path / "tm-dead.lock").exists()
        assert (tmp_path / "tm-live" / "split-0.txt").exists()  # its owner lives
        (tmp_path / "tm-me").mkdir()  # its first task makes it
        me.release()
        assert not (tmp_path / "tm-me").exists() and not (tmp_path / "tm-me.lock").exists()  # it leaves nothing
    finally:
        live.kill()
        live.wait()


def test_the_same_resource_id_twice_is_refused_while_the_first_lives(tmp_path: Path) -> None:
    first = holder(tmp_path, "tm-1")
    try:
        with pytest.raises(RuntimeError, match="in use by another live TaskManager"):
            TempDir(tmp_path, "tm-1").claim(wait_s=0.3)
    finally:
        first.kill()
        first.wait()
    again = TempDir(tmp_path, "tm-1")
    again.claim(wait_s=2)  # its lock went with the process: the same id starts again
    again.release()


def test_an_old_directory_without_a_lock_is_swept_only_when_old(tmp_path: Path) -> None:
    (tmp_path / "tm-old").mkdir()
    (tmp_path / "tm-new").mkdir()
    past = time.time() - 3600
    os.utime(tmp_path / "tm-old", (past, past))
    me = TempDir(tmp_path, "tm-me")
    me.claim()
    assert me.sweep() == [tmp_path / "tm-old"]
    assert (tmp_path / "tm-new").exists()
    me.release()
