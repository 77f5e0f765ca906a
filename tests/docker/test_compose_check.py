"""scripts/compose-check as a test: compose.yaml for real, from images built here (about 6
minutes cold, 2 warm). Marked ``docker`` and ``slow``: not in the default run, nor in CI's
docker step (``-m "docker and not slow"``); run it with
``SLUICE_TEST_DOCKER=1 python -m pytest -m "docker and slow" tests/docker``."""

from __future__ import annotations

import os
import subprocess

import pytest

from tools import ROOT
from tools.containers import start_engine

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.mark.timeout(1800)
def test_compose_check_runs_a_keyed_job_across_containers_through_faults() -> None:
    if os.environ.get("SLUICE_TEST_DOCKER") != "1":
        pytest.skip("set SLUICE_TEST_DOCKER=1 to run compose.yaml on a Docker engine (scripts/compose-check)")
    host, why = start_engine()
    if host is None:
        pytest.skip(why)
    done = subprocess.run([str(ROOT / "scripts" / "compose-check")], capture_output=True, text=True, timeout=1700)
    print(done.stdout[-6000:], done.stderr[-2000:])
    assert done.returncode == 0, done.stdout[-3000:]
    assert "output matches the plain Python count" in done.stdout
    assert "keyed exchange across containers" in done.stdout
