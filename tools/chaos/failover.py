"""Chaos on a Redis Cluster: kill -9 the master that holds a running job's tag, the one that
holds the cluster's tag, or one that holds neither; its replica is promoted, and the job
finishes with exact output.

    scripts/chaos --failover job --runs 10       # the master of the running job's tag
    scripts/chaos --failover cluster --runs 10   # the master of the cluster's tag (membership, lease)
    scripts/chaos --failover other --runs 10     # a master holding neither: the job re-runs nothing
    scripts/chaos --failover all --runs 10       # the three kinds, alternating (both: job and cluster)

Each run: a fresh loopback Redis Cluster (3 masters, 3 replicas: tools/redis_cluster.py, node
timeout 1 s), RQ's queues on a single redis-server of their own (RQ is not cluster-safe), one
JobManager and one TaskManager (two slots) as ``sluice`` processes on one shared Spark
Connect server; a word count (examples/wordcount.py) whose job id is picked so that its tag
is on another master than the cluster's tag, and a TaskManager resource id whose tag is on
the cluster tag's master (so the third master holds neither). Once a task of the job runs,
the master is killed (SIGKILL). Measured from the kill:

    promoted   the slot is served again (by the promoted replica: CLUSTER SLOTS)
    recovered  the first fact committed to the struck tag after the kill (the leader writes
               there again: the job's tag, or the cluster's); for ``other``, the leader's
               ``LogRestarted`` naming the failed slots (it noticed and recovered)
    finished   the job FINISHED

and checked: the job FINISHED, and its output is exactly the word count of its input
(computed here in Python), no process died on its own; for ``other`` (recovery is per
shard: services/jobmanager/restarts.py), the job re-ran nothing: no attempt of it failed
and it was not renumbered. A run that fails says why and keeps its directory (logs of every
process, the cluster nodes' logs).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice.events import AttemptsRenumbered, JobStatus, LogRestarted, TaskState, UpdateTaskExecutionState
from sluice.services.embedded.redis_server import RedisServer
from sluice.services.jobs.state import TERMINAL_JOB
from sluice.store import ClusterBackend, EventLog, Keys
from sluice.store.cluster_admin import NodeError
from sluice.store.log import entry_order
from tools.redis_cluster import LoopbackCluster

__all__ = ["FailoverRun", "failover_campaign"]

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("job", "cluster", "other")
TIMING = {"SLUICE_HEARTBEAT_INTERVAL_MS": "250", "SLUICE_HEARTBEAT_TIMEOUT_MS": "10000", "SLUICE_LEASE_TTL_MS": "4000"}
JOB_TIMEOUT_S = 300.0


@dataclass
class FailoverRun:
    kind: str
    seed: int
    home: Path
    promoted_s: float | None = None
    recovered_s: float | None = None
    finished_s: float | None = None
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def _lines(path: Path, seed: int, n: int = 60_000) -> Path:
    words = "the sluice gate water flow river lock canal basin spark flink stream redis task slot".split()
    rng = __import__("random").Random(seed)
    path.write_text("\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(1, 12))) for _ in range(n)) + "\n")
    return path


def _expected(path: Path) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        counts.update(w for w in re.split(r"[^a-z0-9']+", line.lower()) if w)
    return dict(counts)


def _output(path: Path) -> dict[str, int]:
    import pyarrow.parquet as pq

    table = pq.read_table(str(path)).to_pydict()
    return dict(zip(table["word"], table["count"]))


def _owner(cluster: LoopbackCluster, key: str) -> int | None:
    try:
        return cluster.owner(key)
    except (NodeError, RuntimeError):
        return None


class _Procs:
    def __init__(self, url: str, prefix: str, home: Path, env: dict[str, str]) -> None:
        self.url, self.prefix, self.home, self.env = url, prefix, home, env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, role: str, *args: str) -> None:
        from sluice.services.common.guard import guarded

        cmd = [sys.executable, "-m", "sluice", "--redis", self.url, "--prefix", self.prefix, role, *args]
        with open(self.home / f"{name}.log", "wb") as out:
            self.procs[name] = subprocess.Popen(
                guarded(cmd), stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **self.env}
            )

    def died(self) -> list[str]:
        out = []
        for name, p in self.procs.items():
            if p.poll() is not None:
                tail = (self.home / f"{name}.log").read_text(errors="replace").strip().splitlines()[-1:]
                out.append(f"{name} exited on its own ({p.returncode}): {tail[0][:300] if tail else '(no log)'}")
        return out

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _wait(check: Any, timeout: float, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except (NodeError, OSError, Exception) as exc:  # noqa: BLE001 (a node away mid-failover: not yet)
            if isinstance(exc, (KeyboardInterrupt, AssertionError)):
                raise
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            return None
        time.sleep(every)


def _last_ms(log: EventLog, stream: str) -> int:
    last = log.last_id(stream)
    return entry_order(last)[0] if last else 0


def _announced_after(log: EventLog, cluster_facts: str, after_ms: int) -> bool:
    """Whether a ``LogRestarted`` naming failed slots was committed after ``after_ms``."""
    return any(
        isinstance(env.event, LogRestarted) and env.event.slots and entry_order(entry_id)[0] > after_ms
        for entry_id, env in log.replay(cluster_facts)
    )


def _reran(log: EventLog, job_facts: str) -> list[str]:
    """What a job on a shard that kept its writes must not have done: run anything again."""
    out = []
    facts = [env.event for _, env in log.replay(job_facts)]
    if any(isinstance(ev, AttemptsRenumbered) for ev in facts):
        out.append("the job on a shard that kept its writes was renumbered (its attempts ran again)")
    failed = [
        ev.execution_id
        for ev in facts
        if isinstance(ev, UpdateTaskExecutionState) and ev.state in (TaskState.FAILED, TaskState.CANCELED)
    ]
    if failed:
        out.append(f"the job on a shard that kept its writes had attempts fail or cancelled: {failed[:4]}")
    return out


def run_failover(kind: str, seed: int, root: Path, spark: str, rq_url: str, say: Any = print) -> FailoverRun:
    home = (root / f"{kind}-{seed}").resolve()
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    result = FailoverRun(kind, seed, home)
    cluster = LoopbackCluster(home / "redis-cluster")
    prefix = f"fo{seed}"
    procs: _Procs | None = None
    backend: ClusterBackend | None = None
    try:
        cluster.start()
        from tools.bench.wait import replicas_in_sync

        replicas_in_sync(cluster)  # (a replica that never synced is not promoted)
        backend = ClusterBackend(cluster.url)
        keys = Keys(prefix)
        log = EventLog(backend, keys)
        cluster_port = cluster.owner(keys.cluster)
        job_id = next(f"wc{seed}-{i}" for i in range(1000) if cluster.owner(keys.job(f"wc{seed}-{i}")) != cluster_port)
        tm_id = next(f"tm-{i}" for i in range(1000) if cluster.owner(keys.taskmanager(f"tm-{i}")) == cluster_port)
        busy = {cluster_port, cluster.owner(keys.job(job_id))}
        spare = next(keys.job(f"x{i}") for i in range(1000) if cluster.owner(keys.job(f"x{i}")) not in busy)
        struck = {"job": keys.job(job_id), "cluster": keys.cluster, "other": spare}[kind]
        env = {**TIMING, "SLUICE_RQ_REDIS_URL": rq_url, "SLUICE_SPARK_REMOTE": spark, "SLUICE_HOME": str(home / "home")}
        procs = _Procs(cluster.url, prefix, home, env)
        procs.start("jm", "jobmanager", "--storage-root", (home / "storage").as_uri(), "--slot-timeout", "120")
        procs.start("tm", "taskmanager", "--resource-id", tm_id, "--slots", "2", "--spark", spark)
        from sluice.client import Client, load_job

        text = _lines(home / "input.txt", seed)
        client = Client(log)
        client.submit(
            load_job(ROOT / "examples" / "wordcount.py", {"input": str(text), "output": str(home / "out")}),
            job_id=job_id,
        )
        job_facts = keys.facts(keys.job(job_id))

        def running() -> bool:
            return any(
                isinstance(env.event, UpdateTaskExecutionState) and env.event.state == TaskState.RUNNING
                for _, env in log.replay(job_facts)
            )

        if not _wait(running, 180, 0.05):
            result.failures.append("no task of the job ran within 180 s")
            return result
        port = cluster.owner(struck)
        node = next(n for n in cluster.nodes if n.port == port)
        killed_at_ms = int(time.time() * 1000)
        t0 = time.monotonic()
        node.proc.kill()  # kill -9
        node.proc.wait()
        say(f"  {kind} {seed}: killed -9 the master on port {port} serving {struck} (job {job_id})")
        promoted = _wait(lambda: (o := _owner(cluster, struck)) is not None and o != port, 60)
        result.promoted_s = time.monotonic() - t0 if promoted else None
        if not promoted:
            result.failures.append("no replica was promoted within 60 s")
            return result
        facts = keys.facts(struck)
        if kind == "other":  # nothing is written there: the leader's per-shard restart tells it noticed
            recovered = _wait(lambda: _announced_after(log, keys.facts(keys.cluster), killed_at_ms), 120, 0.05)
        else:
            recovered = _wait(lambda: _last_ms(log, facts) > killed_at_ms, 120, 0.05)
        result.recovered_s = time.monotonic() - t0 if recovered else None
        if not recovered:
            result.failures.append(f"nothing was committed to {struck} within 120 s of the failover")

        def ended() -> Any:
            j = client.job(job_id, missing_ok=True)
            return j if j is not None and j.status in TERMINAL_JOB else None

        job = _wait(ended, JOB_TIMEOUT_S, 0.2)
        result.finished_s = time.monotonic() - t0 if job else None
        if job is None:
            result.failures.append(f"the job did not end within {JOB_TIMEOUT_S:.0f} s of the kill")
        elif job.status != JobStatus.FINISHED:
            result.failures.append(f"the job ended {job.status.value}: {job.reason}")
        else:
            got, want = _output(home / "out"), _expected(text)
            if got != want:
                diff = sorted(set(got.items()) ^ set(want.items()))[:6]
                result.failures.append(f"the output differs from the input's word count: {diff}")
        if kind == "other":
            result.failures += _reran(log, job_facts)
        result.failures += procs.died()
        restarted = [line for line in (home / "jm.log").read_text(errors="replace").splitlines() if "restart" in line]
        result.notes.append(f"{len(restarted)} restart line(s) in the JobManager's log")
    except Exception as exc:  # the harness or the cluster broke: the run failed, say how
        result.failures.append(f"the run stopped: {type(exc).__name__}: {exc}")
    finally:
        if procs is not None:
            procs.stop()
        if backend is not None:
            backend.close()
        cluster.stop()
    if result.ok:
        shutil.rmtree(home / "redis-cluster", ignore_errors=True)
    return result


def failover_campaign(kind: str, runs: int, seed: int, root: Path, say: Any = print) -> list[FailoverRun]:
    """``runs`` runs of one kind (``job``, ``cluster``, ``other``; ``both``: job and cluster
    alternating, ``all``: the three), on one Spark Connect server and one single Redis for RQ's
    queues; prints each run and the summary."""
    from sluice.services.embedded.spark_connect import SparkConnectServer

    kinds = {"both": KINDS[:2], "all": KINDS}.get(kind, (kind,))
    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    spark = SparkConnectServer(log_file=root / "spark-connect.log")
    rq = RedisServer(None)
    results: list[FailoverRun] = []
    try:
        url = spark.start(wait=True)
        rq_url = rq.start()
        for i in range(runs):
            for k in kinds:
                r = run_failover(k, seed + i, root, url, rq_url, say)
                results.append(r)
                timing = ", ".join(
                    f"{name} {v:.1f} s" if v is not None else f"{name} -"
                    for name, v in (
                        ("promoted", r.promoted_s),
                        ("recovered", r.recovered_s),
                        ("finished", r.finished_s),
                    )
                )
                say(f"run {k} {r.seed}: {'ok' if r.ok else 'FAILED'} ({timing})")
                for f in r.failures:
                    say(f"  - {f}")
    finally:
        rq.stop()
        spark.stop()
    say(summary(results))
    return results


def summary(results: list[FailoverRun]) -> str:
    lines = [
        "",
        f"{'kill -9 of':28} {'runs':>5} {'ok':>4}  {'promoted (median/max)':>22}  {'recovered':>14}  {'finished':>14}",
    ]
    for kind in KINDS:
        rs = [r for r in results if r.kind == kind]
        if not rs:
            continue

        def stat(values: list[float | None]) -> str:
            vs = [v for v in values if v is not None]
            return f"{statistics.median(vs):.1f} / {max(vs):.1f} s" if vs else "-"

        what = {"job": "the job's tag's master", "cluster": "the cluster tag's master", "other": "another master"}[kind]
        lines.append(
            f"{what:28} {len(rs):>5} {sum(r.ok for r in rs):>4}  {stat([r.promoted_s for r in rs]):>22}  "
            f"{stat([r.recovered_s for r in rs]):>14}  {stat([r.finished_s for r in rs]):>14}"
        )
    return "\n".join(lines)
