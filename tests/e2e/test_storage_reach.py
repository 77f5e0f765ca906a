"""A TaskManager that cannot see the job's storage root or an input file fails the job at
once, with no restart, naming its host and the path: real processes, and a TaskManager in
a mount namespace of its own (``unshare --mount``) where a private, empty tmpfs hides the
directory every other process sees (what a host without the shared filesystem sees)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sluice.client import Client, JobRefusedError, load_job
from sluice.events import JobStatus, TaskRestartScheduled
from sluice.services.common.guard import guarded
from sluice.services.jobs.state import TERMINAL_JOB
from sluice.store import EventLog
from tests.e2e.conftest import FAST, MARGIN, SLACK, SPARK_START, TEARDOWN, Processes, membership, start_tm, wait_until

ROOT = Path(__file__).resolve().parents[2]
WORDCOUNT = ROOT / "examples" / "wordcount.py"


def _no_private_mounts() -> str | None:
    """Why a process cannot get a private tmpfs here (None: it can)."""
    if os.geteuid() != 0:
        return "a private mount (unshare --mount, mount -t tmpfs) needs root"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    with tempfile.TemporaryDirectory() as d:
        probe = subprocess.run(
            ["unshare", "--mount", "sh", "-c", 'mount -t tmpfs probe "$0"', d],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    return None if probe.returncode == 0 else f"no private tmpfs here: {probe.stderr.strip()[:200]}"


pytestmark = pytest.mark.skipif(bool(_no_private_mounts()), reason=_no_private_mounts() or "")


def start_tm_without(procs: Processes, cluster: dict, name: str, hidden: Path, host: str) -> None:
    """A TaskManager (advertising ``host``) that sees an empty private directory at ``hidden``."""
    cmd = [
        sys.executable,
        "-m",
        "sluice",
        "--redis",
        procs.url,
        "--prefix",
        procs.prefix,
        "taskmanager",
        "--resource-id",
        name,
        "--slots",
        "1",
        "--spark",
        cluster["spark"],
        "--advertise-host",
        host,
    ]
    private = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        'mount -t tmpfs sluice-private "$0" && exec "$@"',
        str(hidden),
        *cmd,
    ]
    with open(procs.logs / f"{name}.log", "wb") as out:
        procs.procs[name] = subprocess.Popen(  # killed with the rest at teardown; its mount goes with it
            guarded(private),
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **FAST, **SLACK, "SLUICE_HOME": str(cluster["home"])},
        )


def write_text(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("the sluice gate\nwater flow the river\n" * 500)
    return path


def fails_at_once(log: EventLog, job_id: str) -> str:
    """The job ends FAILED without a single restart; its reason."""
    client = Client(log)
    job = wait_until(
        lambda: (j := client.job(job_id, missing_ok=True)) is not None and j.status in TERMINAL_JOB and j,
        f"job {job_id} to end",
        timeout=90,
    )
    envs = [e for _, e in log.replay(log.keys.facts(log.keys.job(job_id)))]
    facts = [e.event for e in envs]
    print(
        f"job {job_id}: submitted to {job.status.value} in {envs[-1].ts - envs[0].ts} ms (leader's clock), "
        f"{sum(isinstance(f, TaskRestartScheduled) for f in facts)} restarts"
    )  # (-s shows it)
    assert job.status == JobStatus.FAILED, job.reason
    assert not [f for f in facts if isinstance(f, TaskRestartScheduled)], "a restart was scheduled"
    assert job.reason is not None and "(no restart)" in job.reason
    return job.reason


@pytest.mark.timeout(SPARK_START + 90 + 90 + MARGIN + TEARDOWN)  # registrations, the job
def test_a_taskmanager_with_a_storage_root_of_its_own_fails_the_job_naming_its_host_and_the_marker(
    procs: Processes, log: EventLog, cluster: dict, tmp_path: Path
) -> None:
    storage = tmp_path / "storage"  # the cluster fixture's JobManager writes here
    job_id = "a-job-dir-hidden"  # only the job's directory is hidden: the root itself is seen (its identity
    (storage / job_id).mkdir(parents=True)  # too), so the job is accepted and the check before its tasks fails it
    start_tm(procs, cluster, "tm-shared", slots=1)
    start_tm_without(procs, cluster, "tm-private", storage / job_id, host="host-b")
    wait_until(
        lambda: (
            {r.resource_id: r.host for r in membership(log).active()}.get("tm-private") == "host-b"
            and len(membership(log).active()) == 2
        ),
        "both TaskManagers (tm-private advertising host-b)",
        timeout=90,
    )
    text = write_text(tmp_path / "input" / "in.txt")
    Client(log).submit(load_job(WORDCOUNT, {"input": str(text), "output": str(tmp_path / "out")}), job_id=job_id)
    reason = fails_at_once(log, job_id)
    marker = storage / job_id / "_SLUICE_JOB"
    assert (
        f"TaskManager tm-private on host host-b cannot see the storage root {storage.as_uri()} (marker "
        f"{marker} missing)" in reason
    )
    assert "every TaskManager must reach the same storage root" in reason and "README 'Across hosts'" in reason
    assert marker.is_file()  # the leader wrote it where everyone else sees it


@pytest.mark.timeout(SPARK_START + 90 + 90 + MARGIN + TEARDOWN)  # registration, the job
def test_a_taskmanager_that_cannot_see_an_input_file_fails_the_job_naming_its_host_and_the_file(
    procs: Processes, log: EventLog, cluster: dict, tmp_path: Path
) -> None:
    text = write_text(tmp_path / "input" / "in.txt")
    start_tm_without(procs, cluster, "tm-private", text.parent, host="host-c")
    wait_until(
        lambda: {r.resource_id for r in membership(log).active()} == {"tm-private"}, "the TaskManager", timeout=90
    )
    job_id = Client(log).submit(load_job(WORDCOUNT, {"input": str(text), "output": str(tmp_path / "out")}))
    reason = fails_at_once(log, job_id)
    assert f"TaskManager tm-private on host host-c cannot see the input file {text}" in reason


@pytest.mark.timeout(30 + MARGIN + TEARDOWN)  # the refusal
def test_a_leader_that_cannot_write_the_marker_refuses_the_job_naming_its_host_and_the_path(
    procs: Processes, log: EventLog, tmp_path: Path
) -> None:
    """A storage root not writable at the start stops the JobManager there (tests/test_config_startup.py);
    one that becomes unwritable while it leads (a mount gone read-only, a folder swapped for a file) is
    found when a job's marker is written, and the job refused."""
    blocked = tmp_path / "a-file"
    blocked.mkdir()
    procs.start("jm", "jobmanager", "--storage-root", (blocked / "storage").as_uri(), env={"SLUICE_HOST": "host-jm"})
    wait_until(lambda: log.backend.exists(log.keys.leader), "a leader")
    shutil.rmtree(blocked)
    blocked.write_text("")  # the storage root is under a regular file now: nothing can be written there
    text = write_text(tmp_path / "input" / "in.txt")
    client = Client(log)
    job_id = client.submit(load_job(WORDCOUNT, {"input": str(text), "output": str(tmp_path / "out")}))
    with pytest.raises(JobRefusedError) as info:
        client.wait_accepted(job_id, timeout=30)
    assert f"the JobManager on host host-jm cannot write the job's marker {blocked / 'storage' / job_id}" in str(
        info.value
    )
    assert job_id not in client.job_ids()
