"""One job end to end against a containerised Redis: a JobManager and a TaskManager (real
processes, the session's Spark Connect server) whose log, tables and RQ queues are on a
testcontainers ``redis:7``; CI runs it with the log contract on Docker (.ci/run)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.events import JobStatus
from sluice.store import EventLog, Keys, connect
from tests.conftest import docker_redis
from tests.e2e.conftest import MARGIN, SLACK, SPARK_START, TEARDOWN, Processes, registered, wait_until
from tests.e2e.test_jobs import ROOT, run_job, write_lines
from tools.containers.compose_check import independent_count

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def docker_url() -> Iterator[str]:
    """This module's own container."""
    with docker_redis() as (url, why):
        if url is None:
            pytest.skip(why)
        yield url


@pytest.fixture
def docker_log(docker_url: str, keys: Keys) -> Iterator[EventLog]:
    client = connect(docker_url)
    yield EventLog(client, keys)
    client.close()


@pytest.mark.timeout(SPARK_START + 90 + 120 + MARGIN + TEARDOWN)  # registration, the job
def test_wordcount_runs_through_jobmanager_and_taskmanager_on_a_redis_container(
    docker_url: str, docker_log: EventLog, spark_remote: str, prefix: str, tmp_path: Path
) -> None:
    procs = Processes(docker_url, prefix, tmp_path)
    home = {"SLUICE_HOME": str(tmp_path / "home"), **SLACK}
    try:
        procs.start("jm", "jobmanager", "--storage-root", (tmp_path / "storage").as_uri(), env=home)
        procs.start("tm", "taskmanager", "--resource-id", "tm-1", "--slots", "2", "--spark", spark_remote, env=home)
        wait_until(lambda: registered(docker_log) == {"tm-1"}, "the TaskManager to register", timeout=90)
        text = write_lines(tmp_path / "in.txt", 3000)
        out = tmp_path / "out"
        params = {"input": str(text), "output": str(out), "parallelism": "2", "reducers": "2", "split_bytes": "8192"}
        job_id, job = run_job(docker_log, ROOT / "examples" / "wordcount.py", params)
        assert job.status == JobStatus.FINISHED, job.reason
        import pyarrow.parquet as pq

        table = pq.read_table(out, columns=["word", "count"])
        got = dict(zip(table["word"].to_pylist(), table["count"].to_pylist(), strict=True))
        assert got == independent_count(text) and sum(got.values()) > 3000
        # It went through the container: the job's facts are there.
        assert docker_log.client.exists(docker_log.keys.facts(docker_log.keys.job(job_id)))
    finally:
        procs.stop_all()
        for name in procs.procs:  # shown by pytest only when the test failed
            print(f"----- {name} (last lines) -----")
            print("\n".join(procs.output(name).splitlines()[-25:]))
