"""The bench cluster's job runner: a process of the cluster that dies, or a job that never
ends, is an error naming where to look, not a wait for ever."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from sluice.api import Job
from sluice.client import JobFile
from tools.bench.cluster import BenchCluster


def _noop_job() -> JobFile:
    j = Job("noop")
    j.noop("noop", parallelism=2)
    code = b"# no code\n"
    return JobFile(Path("noop.py"), code, hashlib.sha256(code).hexdigest(), "bench_noop", None, j.graph(), {})


def test_a_dead_process_of_the_cluster_is_named(tmp_path: Path) -> None:
    with BenchCluster(tmp_path / "home") as cluster:
        cluster.spawn("jobmanager")
        cluster.spawn("taskmanager", "--slots", "0")  # refused at once: the cluster has no slots
        with pytest.raises(RuntimeError, match=r"exited with code 2 .*/proc-1\.log"):
            cluster.run_job(_noop_job(), timeout=60)


def test_a_job_that_does_not_end_times_out(tmp_path: Path) -> None:
    with BenchCluster(tmp_path / "home") as cluster:
        cluster.spawn("jobmanager")  # and no TaskManager: the job waits for slots
        with pytest.raises(RuntimeError, match=r"has not ended after 2 s"):
            cluster.run_job(_noop_job(), timeout=2)
