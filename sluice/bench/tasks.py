"""No-op tasks through Sluice's whole path vs raw RQ jobs on the same number of workers.

Sluice: SubmitJob -> JobManager schedules each task on a slot -> SubmitTask through the
outbox -> TaskManager start steps -> RQ enqueue on the slot's queue -> the slot's worker
runs it and reports RUNNING/FINISHED -> the JobManager frees the slot and deploys the next.
Raw RQ: the same number of SimpleWorkers (JSON serializer) draining a queue of no-op jobs.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from rich.table import Table

from sluice.api import Job

from .cluster import BenchCluster
from .console import console

__all__ = ["run", "noop"]


def noop() -> None:
    """The raw RQ job."""


def _raw_rq(url: str, workers: int, tasks: int) -> float:
    from redis import Redis
    from rq import Queue
    from rq.registry import FinishedJobRegistry
    from rq.serializers import JSONSerializer

    conn = Redis.from_url(url)
    name = f"bench-raw-{uuid.uuid4().hex[:8]}"  # a queue (and registries) of its own each run
    q = Queue(name, connection=conn, serializer=JSONSerializer)
    code = ("import sys; from redis import Redis; from rq import Queue, SimpleWorker; "
            "from rq.serializers import JSONSerializer; c = Redis.from_url(sys.argv[1]); "
            "SimpleWorker([Queue(sys.argv[2], connection=c, serializer=JSONSerializer)], connection=c, "
            "serializer=JSONSerializer).work(logging_level='WARNING')")
    procs = [subprocess.Popen([sys.executable, "-c", code, url, name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for _ in range(workers)]
    try:
        from rq import Worker

        deadline = time.monotonic() + 30
        while len(Worker.all(queue=q)) < workers and time.monotonic() < deadline:
            time.sleep(0.05)
        registry = FinishedJobRegistry(queue=q)
        t = time.perf_counter()
        for _ in range(tasks):
            q.enqueue("sluice.bench.tasks.noop", result_ttl=600)
        while registry.count < tasks:
            time.sleep(0.002)
        return tasks / (time.perf_counter() - t)
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _sluice(cluster: BenchCluster, tasks: int) -> float:
    j = Job("noop", max_parallelism=max(128, tasks))
    j.noop("noop", parallelism=tasks)
    return tasks / cluster.run_noop_job(j.graph(), poll_s=0.005)


def run(*, tasks: Sequence[int] = (300, 2000), slots: int = 2) -> list[dict[str, float]]:
    """For each count: Sluice's rate, then raw RQ's on fresh workers, on one Redis."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="sluice-bench-") as home, BenchCluster(Path(home)) as cluster:
        cluster.start_noop("tm-bench", slots)
        _sluice(cluster, 20)  # warm-up: code paths, RQ queues
        for n in tasks:
            with console.status(f"{n} no-op tasks through Sluice on {slots} slots"):
                ours = _sluice(cluster, n)
            with console.status(f"{n} no-op RQ jobs on {slots} SimpleWorkers"):
                raw = _raw_rq(cluster.url, slots, n)
            rows.append({"tasks": n, "raw": raw, "sluice": ours})
    table = Table(title=f"No-op tasks: Sluice's whole path vs raw RQ ({slots} workers each)")
    for col in ("tasks", "raw RQ tasks/s (SimpleWorker, JSON)", "Sluice tasks/s (JobManager + TaskManager + RQ)",
                "Sluice/raw", "target"):
        table.add_column(col, justify="right")
    for r in rows:
        ratio = r["sluice"] / r["raw"]
        table.add_row(f"{r['tasks']:,}", f"{r['raw']:,.0f}", f"{r['sluice']:,.0f}",
                      f"{'[green]' if ratio >= 0.8 else '[red]'}{ratio:.2f}[/]", ">= 0.80 (issue 11's P4)")
    console.print(table)
    return rows
