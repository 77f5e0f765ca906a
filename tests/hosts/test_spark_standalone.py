"""Issue 29, item 4: a Spark standalone cluster across the hosts (a master on host ``spark``, a
worker on each TaskManager host) behind each TaskManager's Spark Connect server, running a
keyed job exactly, with executors on both TaskManager hosts."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.events import JobStatus
from tools.hosts import HostsError, Layout
from tools.hosts.placement import hosts_by_vertex

from .jobs import output_rows, put_workload, submit, wait_ended

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(600)]


def _executor_hosts(cluster) -> dict[str, list[str]]:
    """TaskManager host -> the applications (one per Spark Connect server) that ran executors on
    its worker (each executor gets a directory in the worker's work directory)."""
    return {
        h.name: sorted(p.name for p in (h.directory / "spark-work").glob("app-*")) for h in cluster.taskmanager_hosts()
    }


def test_keyed_job_on_a_standalone_cluster_across_two_hosts_is_exact(hosts_cluster, tmp_path: Path) -> None:
    cluster = hosts_cluster(Layout(taskmanagers=2, slots=2, spark="standalone"))
    input_path, want = put_workload(cluster, tmp_path, seed=41, vocabulary=3000, draws=8000)
    job_id, output = submit(cluster, input_path, parallelism="4", reducers="2")
    job = wait_ended(cluster, job_id, 420)
    assert job.status == JobStatus.FINISHED, job.reason
    assert output_rows(cluster, "tm2", output, tmp_path / "out") == want

    used = {h for hosts in hosts_by_vertex(cluster.log, job_id).values() for h in hosts}
    assert used == {h.namespace for h in cluster.taskmanager_hosts()}, used
    apps = _executor_hosts(cluster)
    assert all(apps.values()), f"a worker ran no executor: {apps}"
    # Every application that ran (one per TaskManager's server) had executors on both hosts:
    # its driver, on one TaskManager host, was reached from the other host's executors.
    assert set(apps["tm1"]) == set(apps["tm2"]), apps
    print(f"standalone: executors of {apps}; spark up {cluster.timings['spark_s']:.1f} s")


def test_an_unknown_spark_mode_is_refused_naming_the_choices() -> None:
    with pytest.raises(HostsError, match=r"Layout.spark is 'yarn': choose one of local, standalone"):
        Layout(spark="yarn")
