"""Acceptance of issue 29: the keyed three-stage job across three TaskManager hosts over a
shared SeaweedFS, and the negative control with storage private to each host."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sluice.client import Client, JobRefusedError, load_job
from sluice.events import JobStatus
from tests.e2e.conftest import membership
from tools.chaos.cluster import poll
from tools.chaos.workload import JOB_FILE
from tools.hosts import Layout
from tools.hosts.placement import cross_reads, hosts_by_vertex

from .jobs import output_rows, put_workload, submit, wait_ended

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(900)]


def test_keyed_job_on_three_hosts_is_exact_and_crosses_hosts(hosts_cluster, tmp_path: Path) -> None:
    cluster = hosts_cluster(Layout(taskmanagers=3, slots=2))
    input_path, want = put_workload(cluster, tmp_path, seed=29)
    t0 = time.monotonic()
    job_id, output = submit(cluster, input_path, parallelism="6", reducers="3")
    job = wait_ended(cluster, job_id, 600)
    print(
        f"acceptance job {job_id}: {job.status.value} in {time.monotonic() - t0:.1f} s wall, "
        f"{job.restarts} restarts; harness up {cluster.timings['up_s']:.1f} s, {cluster.rss_mb():.0f} MB resident"
    )
    assert job.status == JobStatus.FINISHED, job.reason
    assert output_rows(cluster, "tm3", output, tmp_path / "out") == want

    where = hosts_by_vertex(cluster.log, job_id)
    used = {h for hosts in where.values() for h in hosts}
    tm_hosts = {h.namespace for h in cluster.taskmanager_hosts()}
    assert used == tm_hosts, f"subtasks ran on {sorted(h or '?' for h in used)}, not on every host: {where}"
    reads = cross_reads(cluster.log, job_id, cluster.listdir)
    keyed = [(e.source, e.target) for e in job.graph.edges if e.exchange == "keyed"]
    assert len(keyed) == 2, keyed
    for source, target in keyed:
        across = [r for r in reads if (r.source, r.target) == (source, target)]
        assert across, f"no consumer of {source} -> {target} read a partition written on another host: {where}"
        print(f"{source} -> {target}: {len(across)} partitions read across hosts, e.g. {across[0]}")


def test_storage_private_to_each_host_is_refused_at_submission_naming_host_and_path(
    hosts_cluster, tmp_path: Path
) -> None:
    """Each host has a directory of its own where the shared filesystem should be: once the
    TaskManagers have said what they see of the leader's storage root (its _SLUICE_ROOT),
    the submission is refused at once, naming a TaskManager's host and the path."""
    cluster = hosts_cluster(Layout(taskmanagers=2, slots=2, private_storage=True))
    input_path, _ = put_workload(cluster, tmp_path, seed=7, vocabulary=2000, draws=3000)
    tm_hosts = {h.namespace for h in cluster.taskmanager_hosts()}

    def reported() -> bool:
        rows = [r for r in membership(cluster.log).taskmanagers.values() if r.host in tm_hosts]
        return len(rows) == len(tm_hosts) and all(r.root_id for r in rows)

    assert poll(reported, 120, every=0.5), "the TaskManagers did not report on the storage root within 120 s"
    client = Client(cluster.log)  # the refusal is its reply, to its inbox
    job_id = client.submit(load_job(JOB_FILE, {"input": input_path, "output": f"{cluster.shared}/out/refused"}))
    with pytest.raises(JobRefusedError) as refused:
        client.wait_accepted(job_id, timeout=60)
    reason = str(refused.value)
    assert any(h in reason for h in tm_hosts), f"no TaskManager host named in: {reason}"
    assert cluster.shared in reason and "_SLUICE_ROOT" in reason, (
        f"the storage root's identity under {cluster.shared} is not named in: {reason}"
    )
