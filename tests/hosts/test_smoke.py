"""The short slice of the hosts suite (CI: ``-m hosts -k smoke``): two TaskManager hosts, each
with its own /tmp and the same shared filesystem, run a tiny keyed job exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.events import JobStatus
from tools.hosts import Layout
from tools.hosts.placement import hosts_by_vertex

from .jobs import output_rows, put_workload, submit, wait_ended

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(300)]


def test_smoke_two_hosts_share_storage_not_tmp_and_run_a_job(hosts_cluster, tmp_path: Path) -> None:
    cluster = hosts_cluster(Layout(taskmanagers=2, slots=2))
    tm1, tm2 = cluster.hosts["tm1"], cluster.hosts["tm2"]

    tm1.run("sh", "-c", f"echo from-tm1 > /tmp/mine && echo shared > {cluster.shared}/seen")
    assert tm2.run("cat", f"{cluster.shared}/seen").stdout == "shared\n"
    assert tm2.run("test", "-e", "/tmp/mine", check=False).returncode == 1, "tm2 sees tm1's /tmp"
    assert not Path("/tmp/mine").exists(), "the root namespace sees tm1's /tmp"
    assert tm1.run("cat", "/tmp/mine").stdout == "from-tm1\n"

    input_path, want = put_workload(cluster, tmp_path, seed=3, vocabulary=3000, draws=6000)
    job_id, output = submit(cluster, input_path, parallelism="4", reducers="2")
    job = wait_ended(cluster, job_id, 240)
    assert job.status == JobStatus.FINISHED, job.reason
    assert output_rows(cluster, "tm2", output, tmp_path / "out") == want
    used = {h for hosts in hosts_by_vertex(cluster.log, job_id).values() for h in hosts}
    assert used == {tm1.namespace, tm2.namespace}
