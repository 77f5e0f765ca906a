"""No-op tasks through Sluice's whole path vs raw RQ jobs on the same number of workers.

Sluice: SubmitJob -> JobManager schedules each task on a slot -> SubmitTask through the
outbox -> TaskManager start steps -> RQ enqueue on the slot's queue -> the slot's worker
runs it and reports RUNNING/FINISHED -> the JobManager frees the slot and deploys the next.
Raw RQ: the same number of SimpleWorkers (JSON serializer) draining a queue of no-op jobs.

Both sides keep the machine's cores busy, so the rate is set by the CPU a task costs. The
bench prints that too, by process, from /proc (``cpu.CpuMeter``): the profile that says
where Sluice's time goes and what the 0.8x target leaves for the control plane.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.table import Table

from sluice.api import Job
from tools import with_tools

from .cluster import BenchCluster
from .console import console
from .cpu import CpuMeter

__all__ = ["run", "noop", "Rate", "TARGET", "combined"]

TARGET = 0.8
"""Issue 11's P4: Sluice's no-op task rate at least this share of raw RQ's."""


def noop() -> None:
    """The raw RQ job."""


@dataclass
class Rate:
    tasks_per_s: float
    cpu_ms: dict[str, float] = field(default_factory=dict)
    """CPU a task by role, in ms (empty without /proc)."""
    cores: float = 0.0
    """CPU seconds used, all roles, per second of wall time."""


def _measured(meter: CpuMeter, tasks: int) -> Rate:
    return Rate(tasks / meter.wall, meter.per_task_ms(tasks), meter.cores_busy())


def _raw_rq(url: str, workers: int, tasks: int, redis_pid: int | None = None) -> Rate:
    from redis import Redis
    from rq import Queue
    from rq.registry import FinishedJobRegistry
    from rq.serializers import JSONSerializer

    from sluice.store.rq_keys import RQ_PREFIX_ENV, bound_prefix

    rq_here = {RQ_PREFIX_ENV: bound_prefix() or "rq"}  # the workers build RQ's keys as this process does
    conn = Redis.from_url(url)
    name = f"bench-raw-{uuid.uuid4().hex[:8]}"  # a queue (and registries) of its own each run
    q = Queue(name, connection=conn, serializer=JSONSerializer)
    # The job's module is imported before the clock, as a slot worker has its code loaded.
    code = (
        "import sys; import tools.bench.tasks; from redis import Redis; from rq import Queue, SimpleWorker; "
        "from rq.serializers import JSONSerializer; c = Redis.from_url(sys.argv[1]); "
        "SimpleWorker([Queue(sys.argv[2], connection=c, serializer=JSONSerializer)], connection=c, "
        "serializer=JSONSerializer).work(logging_level='WARNING')"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, url, name],
            env={**with_tools(), **rq_here},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(workers)
    ]
    try:
        from rq import Worker

        deadline = time.monotonic() + 30
        while len(Worker.all(queue=q)) < workers and time.monotonic() < deadline:
            time.sleep(0.05)
        registry = FinishedJobRegistry(queue=q)
        roles = {
            "workers": lambda: [p.pid for p in procs],
            "Redis": lambda: [redis_pid] if redis_pid else [],
            "bench: enqueue, wait": lambda: [os.getpid()],
        }
        with CpuMeter(roles) as meter:  # measured before the workers are stopped
            for _ in range(tasks):
                q.enqueue("tools.bench.tasks.noop", result_ttl=600)
            while registry.count < tasks:
                time.sleep(0.002)
        return _measured(meter, tasks)
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _sluice(cluster: BenchCluster, tasks: int, jm: int = 0, tm: int = 0) -> Rate:
    from sluice.services.embedded.supervisor import descendants

    j = Job("noop", max_parallelism=max(128, tasks))
    j.noop("noop", parallelism=tasks)
    roles = {
        "JobManager": lambda: [jm] if jm else [],
        "TaskManager": lambda: [tm] if tm else [],
        "workers": lambda: descendants([tm]) if tm else [],
        "Redis": lambda: [cluster.redis.pid] if cluster.redis.pid else [],
        "bench: submit, wait": lambda: [os.getpid()],
    }
    with CpuMeter(roles) as meter:
        cluster.run_noop_job(j.graph(), poll_s=0.005)
    return _measured(meter, tasks)


ROLES = ("workers", "Redis", "JobManager", "TaskManager")


def combined(rates: Sequence[Rate]) -> Rate:
    """Several rounds of one side as one: the median rate (a round the shared machine slowed
    moves it least), the mean CPU a task and cores busy."""
    n = len(rates)
    roles = {k for r in rates for k in r.cpu_ms}
    return Rate(
        statistics.median(r.tasks_per_s for r in rates),
        {k: sum(r.cpu_ms.get(k, 0.0) for r in rates) / n for k in roles},
        sum(r.cores for r in rates) / n,
    )


def run(*, tasks: Sequence[int] = (300, 2000), slots: int = 2, rounds: int = 3) -> list[dict]:
    """For each count, ``rounds`` rounds of Sluice's rate and raw RQ's on fresh workers, on
    one Redis, in alternating order (the machine's load drifts: neither side always goes
    first); the row gives each side's median and the ratio of the medians."""
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="sluice-bench-") as home, BenchCluster(Path(home)) as cluster:
        jm, tm = cluster.start_noop("tm-bench", slots)
        _sluice(cluster, 20)  # warm-up: code paths, RQ queues
        for n in tasks:
            ours: list[Rate] = []
            raw: list[Rate] = []
            for k in range(rounds):
                for side in ("sluice", "raw") if k % 2 == 0 else ("raw", "sluice"):
                    if side == "sluice":
                        with console.status(f"{n} no-op tasks through Sluice on {slots} slots, round {k + 1}"):
                            ours.append(_sluice(cluster, n, jm.pid, tm.pid))
                    else:
                        with console.status(f"{n} no-op RQ jobs on {slots} SimpleWorkers, round {k + 1}"):
                            raw.append(_raw_rq(cluster.url, slots, n, cluster.redis.pid))
            rows.append(
                {
                    "tasks": n,
                    "raw": combined(raw),
                    "sluice": combined(ours),
                    "rounds": [o.tasks_per_s / w.tasks_per_s for o, w in zip(ours, raw)],
                }
            )
    table = Table(
        title=f"No-op tasks: Sluice's whole path vs raw RQ ({slots} workers each; median of "
        f"{rounds} round{'s' if rounds > 1 else ''})"
    )
    for col in (
        "tasks",
        "raw RQ tasks/s (SimpleWorker, JSON)",
        "Sluice tasks/s (JobManager + TaskManager + RQ)",
        "Sluice/raw",
        "each round",
        "target",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        ratio = r["sluice"].tasks_per_s / r["raw"].tasks_per_s
        table.add_row(
            f"{r['tasks']:,}",
            f"{r['raw'].tasks_per_s:,.0f}",
            f"{r['sluice'].tasks_per_s:,.0f}",
            f"{'[green]' if ratio >= TARGET else '[red]'}{ratio:.2f}[/]",
            " ".join(f"{x:.2f}" for x in r["rounds"]),
            f">= {TARGET:.2f} (issue 11's P4)",
        )
    console.print(table)
    if rows and rows[-1]["sluice"].cpu_ms:
        _print_cpu(rows)
    return rows


def _print_cpu(rows: list[dict]) -> None:
    """Where the CPU goes, by role: the profile behind the ratio."""
    table = Table(title="CPU a task, ms (from /proc), each side's processes (mean of the rounds)")
    table.add_column("process")
    for r in rows:
        table.add_column(f"raw RQ, {r['tasks']:,}", justify="right")
        table.add_column(f"Sluice, {r['tasks']:,}", justify="right")
    names = [*ROLES, *sorted({k for r in rows for side in ("raw", "sluice") for k in r[side].cpu_ms} - set(ROLES))]
    for name in names:
        table.add_row(
            name,
            *(
                f"{r[side].cpu_ms[name]:.2f}" if name in r[side].cpu_ms else ""
                for r in rows
                for side in ("raw", "sluice")
            ),
        )
    table.add_row(
        "[bold]total", *(f"[bold]{sum(r[side].cpu_ms.values()):.2f}" for r in rows for side in ("raw", "sluice"))
    )
    table.add_row("cores busy", *(f"{r[side].cores:.2f}" for r in rows for side in ("raw", "sluice")))
    console.print(table)
    last = rows[-1]
    raw_total = sum(last["raw"].cpu_ms.values())
    floor = sum(last["sluice"].cpu_ms.get(k, 0.0) for k in ("workers", "Redis"))
    console.print(
        f"At {last['tasks']:,} tasks, {TARGET:.1f}x of raw RQ's rate with as many cores busy leaves Sluice "
        f"{raw_total / TARGET:.2f} ms of CPU a task in all; its workers and Redis alone take {floor:.2f} ms, "
        f"leaving {raw_total / TARGET - floor:.2f} ms for the JobManager and TaskManager (they take "
        f"{sum(last['sluice'].cpu_ms.get(k, 0.0) for k in ('JobManager', 'TaskManager')):.2f} ms)."
    )
    cores = (last["raw"].cores, last["sluice"].cores)
    if min(cores) < 0.85 * max(cores):  # (as with one slot on two cores: Sluice's chain then waits, not computes)
        console.print(
            f"The two sides did not keep as many cores busy (raw RQ {cores[0]:.2f}, Sluice {cores[1]:.2f}): "
            "the rates are not set by CPU alone, and the budget above does not bound them.",
            style="yellow",
        )
