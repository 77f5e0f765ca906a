"""A 2-vertex all-to-all no-op job end to end, on a small real cluster (issue 11's P5).

Two no-op vertices of parallelism N joined all-to-all (``Job.noop(..., after=...)``): N
producers, then, once every one of them finished, N consumers. Every task takes the whole
path: the leader schedules it, the TaskManager queues it for a slot, the slot's RQ worker
runs it and reports. The cluster is one TaskManager with ``slots`` slot workers and no
Spark (a no-op needs none). For each N: the time from submission to the job FINISHED, and
the peak resident memory of the whole cluster (Redis, the JobManager, the TaskManager and
its workers) while it ran.

The baseline is PyFlink's MiniCluster running the same job shape in batch mode (a
source of N numbers, ``rebalance``, a printing sink of N), measured in the same run when ``--pyflink`` names a
Python that has ``apache-flink`` installed. The figures the issue measured on this machine
kind are shown beside them (and are the ratio's baseline without ``--pyflink``).
"""

from __future__ import annotations

import subprocess
import tempfile
import textwrap
from collections.abc import Sequence
from pathlib import Path

from rich.table import Table

from sluice.api import Job

from .cluster import BenchCluster
from .console import console
from .memory import PeakRss

__all__ = ["run", "PYFLINK_MEASURED"]


PYFLINK_MEASURED = {8: 0.37, 32: 0.78, 128: 2.5, 512: 13.3}
"""PyFlink 2.3's MiniCluster on this machine kind, seconds (issue 11's measurement)."""

TARGET_MB = 1024


def _sluice(cluster: BenchCluster, n: int) -> float:
    j = Job(f"all-to-all-noop-{n}", max_parallelism=max(128, n))
    j.noop("producers", parallelism=n)
    j.noop("consumers", parallelism=n, after="producers")
    return cluster.run_noop_job(j.graph())


PYFLINK_SCRIPT = textwrap.dedent("""
    import sys, time
    from pyflink.common import Configuration, WatermarkStrategy
    from pyflink.datastream import RuntimeExecutionMode, StreamExecutionEnvironment
    from pyflink.datastream.connectors.number_seq import NumberSequenceSource
    conf = Configuration()  # the default 64 MB of network buffers cannot shuffle 512 x 512 channels
    conf.set_string("taskmanager.memory.network.min", "512mb")
    conf.set_string("taskmanager.memory.network.max", "512mb")
    env = StreamExecutionEnvironment.get_execution_environment(conf)
    env.set_runtime_mode(RuntimeExecutionMode.BATCH)
    for n in map(int, sys.argv[1:]):
        env.set_parallelism(n)
        # Java operators only (no Python worker): a source of N, all-to-all, a sink of N
        source = env.from_source(NumberSequenceSource(1, n), WatermarkStrategy.no_watermarks(), "numbers")
        source.rebalance().print()
        t = time.perf_counter()
        env.execute(f"a2a-{n}")
        print(f"RESULT {n} {time.perf_counter() - t:.4f}", flush=True)
""")


def _pyflink(python: str, sizes: Sequence[int]) -> dict[int, float]:
    """The same job shape on PyFlink's MiniCluster, each size once after a warm-up run."""
    with tempfile.TemporaryDirectory(prefix="sluice-bench-pyflink-") as tmp:
        script = Path(tmp) / "a2a.py"
        script.write_text(PYFLINK_SCRIPT)
        done = subprocess.run(
            [python, str(script), str(min(sizes)), *map(str, sizes)], capture_output=True, text=True, timeout=900
        )  # the first run warms the MiniCluster up
    out = {}
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            _, n, s = line.split()
            out[int(n)] = float(s)  # a size run twice (the warm-up) keeps its second time
    if not out:
        raise RuntimeError(f"PyFlink ran no job ({python}): {done.stderr[-2000:]}")
    return out


def run(*, sizes: Sequence[int] = (8, 32, 128, 512), slots: int = 4, pyflink: str | None = None) -> dict[int, float]:
    times: dict[int, float] = {}
    peaks: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="sluice-bench-") as home, BenchCluster(Path(home)) as cluster:
        jm, tm = cluster.start_noop("tm-a2a", slots)
        redis_pid = cluster.redis.pid
        with console.status("warm-up: 2 x 8"):
            _sluice(cluster, 8)
        for n in sizes:
            with (
                console.status(f"2 x {n} no-op tasks, all-to-all, on {slots} slots"),
                PeakRss([p for p in (redis_pid, jm.pid, tm.pid) if p]) as rss,
            ):
                times[n] = _sluice(cluster, n)
            peaks[n] = rss.peak
    theirs: dict[int, float] = {}
    measured = pyflink is not None
    if pyflink is not None:
        with console.status(f"PyFlink MiniCluster ({pyflink})"):
            theirs = _pyflink(pyflink, sizes)
    table = Table(
        title=f"2-vertex all-to-all no-op job end to end: Sluice (1 TaskManager, {slots} slot workers) "
        "vs PyFlink's MiniCluster"
    )
    for col in (
        "N",
        "tasks",
        "Sluice s",
        "tasks/s",
        "PyFlink s",
        "Sluice/PyFlink",
        "PyFlink s (issue)",
        "cluster peak MB",
    ):
        table.add_column(col, justify="right")
    for n in sizes:
        base = theirs.get(n) if measured else PYFLINK_MEASURED.get(n)
        ratio = times[n] / base if base else None
        quoted = PYFLINK_MEASURED.get(n)
        table.add_row(
            f"{n:,}",
            f"{2 * n:,}",
            f"{times[n]:.2f}",
            f"{2 * n / times[n]:,.0f}",
            f"{theirs[n]:.2f}" if measured and n in theirs else "-",
            f"{'[green]' if ratio < 1 else '[red]'}{ratio:.2f}[/]" if ratio is not None else "-",
            f"{quoted:.2f}" if quoted else "-",
            f"{'[green]' if peaks[n] < TARGET_MB else '[red]'}{peaks[n]:,.0f}[/]",
        )
    console.print(table)
    console.print(
        (
            "Sluice/PyFlink is against PyFlink measured in this run (batch mode, a new MiniCluster per "
            "job, as PyFlink runs a local job)."
            if measured
            else "Sluice/PyFlink is against the issue's figures (PyFlink was not measured in this run: pass "
            "--pyflink PYTHON, a Python with apache-flink installed)."
        )
        + f" Targets (issue 11's P5): Sluice faster than PyFlink at 512; the cluster under {TARGET_MB:,} MB.",
        style="dim",
    )
    return times
