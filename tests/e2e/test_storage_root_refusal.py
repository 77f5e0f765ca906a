"""A job is refused at submission, at once, while a registered TaskManager cannot see the
storage root, naming its host and the path; a TaskManager that sees it says so and jobs
run. Real processes: the leader tells its root's identity (``_SLUICE_ROOT``) at
registration, and one TaskManager runs in a mount namespace of its own where an empty
private tmpfs hides the storage root (what a host without the shared filesystem sees)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from sluice.client import Client, load_job
from sluice.events import JobStatus
from sluice.services.jobs.state import TERMINAL_JOB
from sluice.store import EventLog
from tests.e2e.conftest import MARGIN, SPARK_START, TEARDOWN, Processes, membership, start_tm, wait_until
from tests.e2e.test_storage_reach import WORDCOUNT, pytestmark, start_tm_without, write_text

__all__ = ["pytestmark"]  # (skipped where a process cannot get a private tmpfs)


def sluice(procs: Processes, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    return subprocess.run(
        [sys.executable, "-m", "sluice", "--redis", procs.url, "--prefix", procs.prefix, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.timeout(SPARK_START + 90 + 120 + 90 + 120 + MARGIN + TEARDOWN)  # registrations, a job, the refusal
def test_a_submission_is_refused_at_once_while_a_taskmanager_cannot_see_the_storage_root(
    procs: Processes, log: EventLog, cluster: dict, tmp_path: Path
) -> None:
    storage = tmp_path / "storage"  # the cluster fixture's JobManager's root
    storage.mkdir()
    root = storage.as_uri()
    start_tm(procs, cluster, "tm-shared", slots=1)
    row = wait_until(
        lambda: (r := membership(log).taskmanagers.get("tm-shared")) is not None and r.root_id and r,
        "tm-shared's report on the storage root",
        timeout=90,
    )
    root_id = orjson.loads((storage / "_SLUICE_ROOT").read_bytes())["root_id"]
    assert (row.storage_root, row.root_id, row.storage_problem) == (root, root_id, None)
    text = write_text(tmp_path / "input" / "in.txt")
    client = Client(log)
    ran = client.submit(load_job(WORDCOUNT, {"input": str(text), "output": str(tmp_path / "out")}))
    job = wait_until(
        lambda: (j := client.job(ran, missing_ok=True)) is not None and j.status in TERMINAL_JOB and j,
        "the job on the TaskManager that sees the root to end",
        timeout=120,
    )
    assert job.status == JobStatus.FINISHED, job.reason

    start_tm_without(procs, cluster, "tm-private", storage, host="host-b")
    wait_until(
        lambda: (r := membership(log).taskmanagers.get("tm-private")) is not None and r.root_id,
        "tm-private's report on the storage root",
        timeout=90,
    )
    began = time.monotonic()
    refused = sluice(
        procs, tmp_path, "submit", str(WORDCOUNT), "-p", f"input={text}", "-p", f"output={tmp_path / 'out2'}"
    )
    print(f"sluice submit refused in {time.monotonic() - began:.2f} s (the command's start-up included)")  # (-s)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    said = " ".join(refused.stderr.split())  # (the console wraps long lines)
    assert (
        f"TaskManager tm-private on host host-b cannot see the storage root {root} "
        f"({storage / '_SLUICE_ROOT'}: missing)" in said
    ), refused.stderr
    assert "README 'Across hosts'" in said
    assert client.job_ids() == [ran]  # nothing was accepted, nothing runs, no restart burns

    status = sluice(procs, tmp_path, "status")
    assert status.returncode == 0, status.stderr
    assert "warning: TaskManager tm-private on host host-b cannot see the storage root" in " ".join(
        status.stdout.split()
    )
