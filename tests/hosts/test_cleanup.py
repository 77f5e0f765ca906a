"""A run whose owner died (kill -9, as a crashed test session) is removed by
``scripts/hosts clean``: processes, FUSE mounts, namespaces, links, directories."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tools.chaos import procs
from tools.hosts.cleanup import leftovers
from tools.hosts.state import RunState, runs

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(180)]

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "hosts"

OWNER = """
import sys, time
from tools.hosts import HostsCluster, Layout
c = HostsCluster(Layout(taskmanagers=1, slots=1)).up()
print(c.run, flush=True)
time.sleep(600)
"""


def test_clean_removes_everything_a_killed_owner_left(hosts_available: None) -> None:
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True)
    try:
        run = (owner.stdout.readline() if owner.stdout else "").strip()
        assert run, "the owner did not bring its cluster up"
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
    (state,) = [s for s in runs() if s.run == run]
    left = leftovers(state)
    assert any(item.startswith("network namespace") for item in left)
    assert any("weed mount" in item for item in left), left
    assert not state.owner_alive()

    status = subprocess.run([str(SCRIPT), "status"], capture_output=True, text=True, timeout=60)
    assert f"run {run} (owner pid {owner.pid} dead" in status.stdout
    done = subprocess.run([str(SCRIPT), "clean"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and f"run {run}: removed" in done.stdout, done.stdout + done.stderr
    assert leftovers(state) == []
    assert not state.path.exists() and not Path(state.directory).exists()
    assert not [p for p in procs.find(lambda a: state.directory in " ".join(a))]
    assert state.run not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_clean_leaves_a_run_whose_owner_lives(hosts_available: None, tmp_path: Path) -> None:
    state = RunState("live" + os.urandom(2).hex(), procs.ident(os.getpid()) or (os.getpid(), 0), str(tmp_path / "d"))
    Path(state.directory).mkdir()
    state.save()
    try:
        done = subprocess.run([str(SCRIPT), "clean"], capture_output=True, text=True, timeout=60)
        assert f"run {state.run}" not in done.stdout
        assert state.path.exists() and Path(state.directory).exists()
    finally:
        state.path.unlink(missing_ok=True)


def test_the_operator_command_brings_a_run_up_shows_it_and_takes_it_down(hosts_available: None) -> None:
    up = subprocess.run(
        [str(SCRIPT), "up", "--taskmanagers", "1", "--private-storage"], capture_output=True, text=True, timeout=120
    )
    assert up.returncode == 0, up.stdout + up.stderr
    run = up.stdout.split()[1]
    try:
        assert "tm1" in up.stdout and "redis://198.18." in up.stdout
        status = subprocess.run([str(SCRIPT), "status"], capture_output=True, text=True, timeout=60).stdout
        assert f"run {run} (no owner" in status
        clean = subprocess.run([str(SCRIPT), "clean"], capture_output=True, text=True, timeout=60)
        assert f"run {run}" not in clean.stdout, "clean removed a run left up on purpose"
    finally:
        down = subprocess.run([str(SCRIPT), "down", run], capture_output=True, text=True, timeout=120)
    assert down.returncode == 0 and f"run {run} is gone" in down.stdout, down.stdout + down.stderr
    assert [s for s in runs() if s.run == run] == []


def test_down_of_an_unknown_run_says_how_to_find_the_runs() -> None:
    done = subprocess.run([str(SCRIPT), "down", "nosuch"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "no run 'nosuch': `scripts/hosts status` lists the runs" in done.stderr
