"""Sluice with its log on a Redis Cluster (three masters, three replicas, on loopback): a
JobManager, a TaskManager and its RQ workers, real Spark; RQ's queues on a single Redis of
their own (the session's), as RQ is not cluster-safe.

The jobs' ids are picked so that their hash tags fall on different masters, and the test
shows it from the cluster itself (``CLUSTER KEYSLOT`` of each tag, ``CLUSTER SHARDS``)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from sluice.client import Client, load_job
from sluice.events import JobStatus
from sluice.services.jobs.state import TERMINAL_JOB
from sluice.store import ClusterBackend, EventLog, Keys
from tests.e2e.conftest import MARGIN, SLACK, SPARK_START, TEARDOWN, Processes, registered, start_tm, wait_until
from tests.e2e.test_jobs import write_lines

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cluster_log(redis_cluster: Any, keys: Keys) -> Iterator[EventLog]:
    backend = ClusterBackend(redis_cluster.url)
    yield EventLog(backend, keys)
    for key in backend.scan_keys(keys.pattern):
        backend.delete(key)
    backend.close()


@pytest.fixture
def on_cluster(
    redis_cluster: Any, redis_url: str, prefix: str, tmp_path: Path, spark_remote: str
) -> Iterator[tuple[Processes, dict[str, Any]]]:
    """A JobManager on the cluster's log, RQ's queues on the session's single Redis."""
    procs = Processes(redis_cluster.url, prefix, tmp_path)
    home = tmp_path / "home"
    rq = {"SLUICE_RQ_REDIS_URL": redis_url}
    procs.start(
        "jm",
        "jobmanager",
        "--storage-root",
        (tmp_path / "storage").as_uri(),
        "--slot-timeout",
        "120",
        env={"SLUICE_HOME": str(home), **SLACK, **rq},
    )
    yield procs, {"home": home, "spark": spark_remote, "env": rq}
    procs.stop_all()
    for name in procs.procs:  # shown by pytest only when the test failed
        print(f"----- {name} (last lines) -----")
        print("\n".join(procs.output(name).splitlines()[-25:]))


def _ids_on_distinct_masters(backend: ClusterBackend, keys: Keys, n: int) -> list[str]:
    """``n`` job ids whose tags are served by ``n`` different masters."""
    chosen: dict[str, str] = {}
    for i in range(1000):
        job_id = f"cl{i:04d}"
        chosen.setdefault(backend.node_of(keys.facts(keys.job(job_id))), job_id)
        if len(chosen) == n:
            return list(chosen.values())
    raise AssertionError("no job ids fall on enough masters")


def _shard_of(redis_cluster: Any, tag: str) -> tuple[int, int]:
    """(the slot of ``tag`` by CLUSTER KEYSLOT, the port of the master CLUSTER SHARDS names for it)."""
    c = redis.Redis(host="127.0.0.1", port=redis_cluster.alive()[0].port, decode_responses=True)
    slot = int(c.execute_command("CLUSTER KEYSLOT", tag))
    for shard in c.execute_command("CLUSTER SHARDS"):
        shard = dict(zip(shard[::2], shard[1::2])) if isinstance(shard, list) else shard
        ranges = shard["slots"]
        nodes = [dict(zip(n[::2], n[1::2])) if isinstance(n, list) else n for n in shard["nodes"]]
        if any(int(ranges[i]) <= slot <= int(ranges[i + 1]) for i in range(0, len(ranges), 2)):
            master = next(n for n in nodes if n["role"] == "master")
            return slot, int(master["port"])
    raise AssertionError(f"no shard serves slot {slot}")


@pytest.mark.slow
@pytest.mark.timeout(SPARK_START + 90 + 2 * 180 + MARGIN + TEARDOWN)
def test_a_wordcount_and_the_clickstream_run_with_their_jobs_on_two_shards(
    on_cluster: tuple[Processes, dict[str, Any]], cluster_log: EventLog, redis_cluster: Any, spark, tmp_path: Path
) -> None:
    procs, cluster = on_cluster
    backend = cluster_log.backend
    assert isinstance(backend, ClusterBackend)
    keys = cluster_log.keys
    start_tm(procs, cluster, "tm-1", slots=2, env=cluster["env"])
    wait_until(lambda: registered(cluster_log) == {"tm-1"}, "the TaskManager", timeout=90)

    spec = importlib.util.spec_from_file_location("clickstream_example", ROOT / "examples" / "clickstream.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.generate(tmp_path / "clicks", files=2, rows=5000)
    text = write_lines(tmp_path / "in.txt")

    words_id, clicks_id = _ids_on_distinct_masters(backend, keys, 2)
    client = Client(cluster_log)
    client.submit(
        load_job(ROOT / "examples" / "wordcount.py", {"input": str(text), "output": str(tmp_path / "words")}),
        job_id=words_id,
    )
    client.submit(
        load_job(
            ROOT / "examples" / "clickstream.py",
            {"input": str(tmp_path / "clicks"), "output": str(tmp_path / "clicks-out"), "split_bytes": "20000"},
        ),
        job_id=clicks_id,
    )
    for job_id in (words_id, clicks_id):
        job = wait_until(
            lambda job_id=job_id: (
                (j := client.job(job_id, missing_ok=True)) is not None and j.status in TERMINAL_JOB and j
            ),
            f"job {job_id} to end",
            timeout=180,
        )
        assert job.status == JobStatus.FINISHED, job.reason

    # Exact output, as plain PySpark computes it.
    from pyspark.sql import functions as F

    got = {r["word"]: r["count"] for r in spark.read.parquet(str(tmp_path / "words")).collect()}
    words = (
        spark.read.text(str(text))
        .select(F.explode(F.split(F.lower("value"), r"[^a-z0-9']+")).alias("word"))
        .where("word != ''")
    )
    assert got == {r["word"]: r["count"] for r in words.groupBy("word").count().collect()}
    clicks = sorted(tuple(r) for r in spark.read.parquet(str(tmp_path / "clicks-out")).collect())
    want = example.per_user(example.per_user_page(spark.read.parquet(str(tmp_path / "clicks"))))
    assert clicks == sorted(tuple(r) for r in want.collect()) and len(clicks) > 1000

    # The two jobs' histories live on two shards, as the cluster itself says.
    shards = {job_id: _shard_of(redis_cluster, keys.job(job_id)) for job_id in (words_id, clicks_id)}
    assert len({port for _, port in shards.values()}) == 2, shards
    for job_id, (_, port) in shards.items():
        facts = keys.facts(keys.job(job_id))
        assert backend.node_of(facts) == f"127.0.0.1:{port}"
        assert redis.Redis(host="127.0.0.1", port=port).xlen(facts) > 10  # the job's facts, on its shard
    print(f"\njobs on shards (slot, master port): {shards}; cluster tag: {_shard_of(redis_cluster, keys.cluster)}")

    # The read models rebuilt from the log agree with the live ones (as on one Redis).
    from sluice.services.projector import Projector
    from sluice.views.replay import check

    Projector(cluster_log).catch_up()
    Projector(cluster_log).catch_up()
    result = check(cluster_log)
    assert result.agree, [vars(d) for d in result.differences[:10]]


def test_a_taskmanager_on_a_cluster_log_without_a_queue_redis_refuses_to_start(
    redis_cluster: Any, prefix: str, tmp_path: Path
) -> None:
    """RQ is not cluster-safe: with the log on a cluster and no $SLUICE_RQ_REDIS_URL, a
    TaskManager says what to set and exits, before it registers."""
    env = {k: v for k, v in os.environ.items() if k != "SLUICE_RQ_REDIS_URL"}
    env["SLUICE_HOME"] = str(tmp_path / "home")
    done = subprocess.run(
        [sys.executable, "-m", "sluice", "--redis", redis_cluster.url, "--prefix", prefix, "taskmanager"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode != 0
    said = done.stdout + done.stderr
    assert "SLUICE_RQ_REDIS_URL" in said and "not cluster-safe" in said and "Traceback" not in said
