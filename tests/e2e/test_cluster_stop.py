"""`sluice status` and `sluice cluster stop` on an embedded cluster whose Redis died
(kill -9): status says Redis is away and what still runs, and stop leaves nothing behind."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from sluice.services.embedded.supervisor import descendants
from tests.e2e.conftest import MARGIN, alive, wait_until
from tests.e2e.test_cli import sluice


@pytest.mark.timeout(90 + 30 + 90 + MARGIN)  # start, status, stop
def test_stop_and_status_when_the_clusters_redis_was_killed(tmp_path: Path) -> None:
    sluice(tmp_path, "cluster", "start", "--taskmanagers", "2", "--slots", "1")
    state = json.loads((tmp_path / ".sluice" / "cluster.json").read_text())
    started = [p["pid"] for p in state["processes"]]
    children = descendants(started)  # the TaskManagers' RQ workers
    everything = started + children
    try:
        assert len(children) >= 2, children
        os.kill(state["redis"]["pid"], signal.SIGKILL)
        wait_until(lambda: not alive(state["redis"]["pid"]), "Redis to die", timeout=10)

        st = sluice(tmp_path, "status", check=False, timeout=30)
        assert st.returncode == 1, st.stdout + st.stderr
        assert "is away (its process is gone)" in st.stderr and "Traceback" not in st.stderr, st.stderr
        for p in state["processes"]:
            if alive(p["pid"]):  # (the projector may have died with Redis: not this test's matter)
                assert f"{p['role']} {p['name']} (pid {p['pid']})" in st.stderr, st.stderr
        assert "jobmanager" in st.stderr and st.stderr.count("taskmanager tm-") == 2, st.stderr

        began = time.monotonic()
        stop = sluice(tmp_path, "cluster", "stop", timeout=90)
        took = time.monotonic() - began
        print(stop.stdout)
        assert "does not answer" in stop.stdout, stop.stdout
        assert "stopped jobmanager" in stop.stdout and "RQ worker" in stop.stdout, stop.stdout
        left = [pid for pid in everything if alive(pid)]
        assert not left, f"still running after `sluice cluster stop`: {left}\n{stop.stdout}"
        assert json.loads((tmp_path / ".sluice" / "cluster.json").read_text()).get("processes", []) == []
        assert took < 40, f"stop took {took:.0f} s"
        # The cluster is gone for good: status reads the data with Redis brought back for it.
        after = sluice(tmp_path, "status", "--json", timeout=60)
        assert json.loads(after.stdout)["taskmanagers"], after.stdout
    finally:
        for pid in everything:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(60 + MARGIN)
def test_status_with_a_given_redis_that_is_away_says_so_without_a_traceback(tmp_path: Path) -> None:
    from sluice.services.embedded import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"
    st = sluice(tmp_path, "--redis", url, "status", check=False, timeout=30)
    assert st.returncode == 1
    assert f"cannot reach Redis at {url}" in st.stderr and "Traceback" not in st.stderr, st.stderr
