"""A short campaign across hosts, as an operator runs it (``scripts/chaos --hosts``): the two
faults that must end in a refusal (a TaskManager host cut off past its heartbeat timeout,
the leader's host cut off past its lease), each run checking exact output, replay, fences
and leaks on every host. Its own marker: ``pytest -m chaos_hosts`` (as root)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tools.hosts import unavailable

pytestmark = [pytest.mark.chaos_hosts, pytest.mark.timeout(1200)]

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "chaos"


def test_two_runs_survive_a_cut_taskmanager_host_and_a_cut_leader(tmp_path: Path) -> None:
    why = unavailable()
    if why:
        pytest.skip(f"hosts are not available here: {why}")
    summary = tmp_path / "summary.txt"
    done = subprocess.run(
        [
            str(SCRIPT),
            "--hosts",
            "--runs",
            "2",
            "--seed",
            "0",
            "--dir",
            str(tmp_path / "runs"),
            "--summary",
            str(summary),
        ],
        capture_output=True,
        text=True,
        timeout=1100,
    )
    print(done.stdout[-6000:], done.stderr[-3000:])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = summary.read_text()
    assert "2 runs: every job's output exact, replay equals the tables, no stale write, nothing leaked" in text
    assert "tm-cut of tm" in done.stdout and "declared lost after" in done.stdout and " healed: " in done.stdout
    assert "jm-cut of leader" in done.stdout and "reconnected:" in done.stdout
