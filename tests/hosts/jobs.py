"""The chaos suite's keyed three-stage job run on a cluster across hosts: its input put on the
shared filesystem, its end awaited on the log, its sink read back from a host."""

from __future__ import annotations

from pathlib import Path

from sluice.client import Client, load_job
from sluice.services.jobs.state import TERMINAL_JOB, JobRun
from tools.chaos.cluster import poll
from tools.chaos.workload import JOB_FILE, Row, expected, generate, read_output
from tools.hosts import HostsCluster


def put_workload(cluster: HostsCluster, tmp_path: Path, seed: int, **sizes: int) -> tuple[str, list[Row]]:
    """Generate the chaos workload here, copy it onto the shared filesystem from the first
    TaskManager host (with storage private to each host: onto every host running Sluice, so
    that only the storage root differs between hosts); (its path there, the rows expected,
    computed in plain Python)."""
    work = generate(tmp_path / "input.txt", seed, **sizes)
    targets = (
        [h for h in cluster.hosts.values() if h.name in cluster.roles]
        if cluster.layout.private_storage
        else cluster.taskmanager_hosts()[:1]
    )
    for host in targets:
        host.put(work.path, f"{cluster.shared}/input")
    return f"{cluster.shared}/input/input.txt", expected(work.path)


def submit(cluster: HostsCluster, input_path: str, name: str = "job-1", **params: str) -> tuple[str, str]:
    """Submit the job; (job id, its output path on the shared filesystem)."""
    output = f"{cluster.shared}/out/{name}"
    job_file = load_job(JOB_FILE, {"input": input_path, "output": output, **params})
    return Client(cluster.log).submit(job_file), output


def wait_ended(cluster: HostsCluster, job_id: str, timeout: float) -> JobRun:
    def ended() -> JobRun | None:
        job = Client(cluster.log).job(job_id, missing_ok=True)
        return job if job is not None and job.status in TERMINAL_JOB else None

    job = poll(ended, timeout, every=0.5)
    assert job is not None, f"job {job_id} did not end within {timeout:.0f} s; logs in {cluster.directory}"
    return job


def output_rows(cluster: HostsCluster, host: str, output: str, into: Path) -> list[Row]:
    """The sink as read back from ``host`` (through its own mount)."""
    return read_output(cluster.hosts[host].get(output, into))
