"""The control plane at scale: a 2-vertex all-to-all job (source -> keyed transform) at
parallelism N per vertex.

* build: the ExecutionGraph built from the submitted JobGraph (the JobManager's fold of
  JobSubmitted + ExecutionGraphBuilt), in-process.
* deploy: from SubmitJob to every task deployed, through Redis, a JobManager process and
  TaskManager processes that acknowledge and finish tasks without running them, with slots
  enough for all of one vertex's subtasks at once.

Linear growth is the check: time per subtask should stay about flat as N grows tenfold.
"""

from __future__ import annotations

import hashlib
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from rich.table import Table

from sluice.api import Job
from sluice.client import Client, JobFile
from sluice.events import JobStatus, SubmitJob, TaskState
from sluice.services.jobs import core
from sluice.services.jobs.state import JobsState

from .cluster import BenchCluster
from .console import console

__all__ = ["run"]


def identity(df):  # the transform's name only; nothing runs
    return df


def graph(n: int, source: str):
    j = Job(f"all-to-all-{n}", max_parallelism=max(128, n))
    j.read_text("src", source, parallelism=n).key_by("value").map("agg", identity, parallelism=n).write_parquet(
        "out", "/tmp/sluice-bench-out"
    )
    return j.graph()


def build_time(n: int, source: str) -> float:
    msg = SubmitJob("b", graph(n, source), "blob", "m", "reply")
    t = time.perf_counter()
    core.decide(JobsState(), core.Submit(msg, {"src": []}, "file:///tmp/s"), 0)
    return time.perf_counter() - t


def deploy_time(cluster: BenchCluster, n: int, source: str) -> tuple[float, float]:
    code = b"def identity(df):\n    return df\n"
    g = graph(n, source)
    job = JobFile(Path("x.py"), code, hashlib.sha256(code).hexdigest(), "tools.bench.control", None, g, {})
    client = Client(cluster.log)
    t = time.perf_counter()
    job_id = client.submit(job)
    deployed = None
    frontier = 0
    while True:
        state = client.job(job_id, missing_ok=True)
        if state is not None:
            if deployed is None and state.built:
                frontier = _deployed_up_to(state, frontier)
                if frontier < 0:
                    deployed = time.perf_counter() - t
            if state.status in (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.CANCELED):
                break
        time.sleep(0.02)
    if state.status != JobStatus.FINISHED:
        raise RuntimeError(f"the benchmark job ended {state.status.value}: {state.reason}")
    return deployed or 0.0, time.perf_counter() - t


def _deployed_up_to(state, frontier: int) -> int:
    """-1 when every subtask is past SCHEDULED, else the index (in ``executions()`` order) of
    the first one that is not, looking from ``frontier`` on: the poll costs what deployed since
    the last one, not the whole job (a scan of 20,000 subtasks every 20 ms was half of this
    process's CPU, taken from the cluster it measures). Only a full pass says -1."""
    undeployed = (TaskState.CREATED, TaskState.SCHEDULED)
    executions = list(state.executions())
    for i in range(frontier, len(executions)):
        if executions[i].state in undeployed:
            return i
    if frontier and any(ex.state in undeployed for ex in executions[:frontier]):  # a subtask restarted
        return 0
    return -1


def run(*, sizes: Sequence[int] = (100, 1000, 10000)) -> dict[int, tuple[float, float, float]]:
    out = {}
    with tempfile.TemporaryDirectory(prefix="sluice-bench-") as home:
        source = Path(home) / "in.txt"
        source.write_text("x\n")
        for n in sizes:
            out[n] = (min(build_time(n, str(source)) for _ in range(3)), 0.0, 0.0)
        with BenchCluster(Path(home)) as cluster:
            slots_per_tm = 1000
            tms = max(1, -(-max(sizes) // slots_per_tm))
            cluster.spawn("jobmanager")
            for i in range(tms):
                cluster.spawn("taskmanager", "--resource-id", f"tm-{i}", "--slots", str(slots_per_tm), "--no-execute")
            cluster.wait_registered(tms)
            for n in sizes:
                with console.status(f"deploying 2 x {n} tasks"):
                    deployed, finished = deploy_time(cluster, n, str(source))
                out[n] = (out[n][0], deployed, finished)
    table = Table(
        title=f"Control plane: 2-vertex all-to-all job, no-execute TaskManagers ({tms} x {slots_per_tm} slots)"
    )
    for col in ("parallelism", "subtasks", "build ms", "µs/subtask", "deploy all s", "ms/subtask", "finish s"):
        table.add_column(col, justify="right")
    for n, (b, d, f) in out.items():
        table.add_row(
            f"{n:,}",
            f"{2 * n:,}",
            f"{b * 1000:,.1f}",
            f"{b / (2 * n) * 1e6:,.1f}",
            f"{d:,.2f}",
            f"{d / (2 * n) * 1000:,.2f}",
            f"{f:,.2f}",
        )
    console.print(table)
    console.print("Flink 1.14 (server): 2 x 10,000 built in 627 ms, deployed in 17 s.", style="dim")
    return out
