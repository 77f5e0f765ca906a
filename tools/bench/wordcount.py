"""Word count: ``sluice run examples/wordcount.py`` vs the same transformations in plain
PySpark (issue 11's P7), on each corpus and size asked for (``tools.bench.corpus``).

Two comparisons, each measured in the same run:

* **the job**: SubmitJob to FINISHED on a warm cluster (a JobManager and a TaskManager whose
  workers ran the job once already), against the same transformations in one warm plain
  session (after a warm-up), both on the same warm Spark Connect server, in rounds of
  plain then Sluice (a change in the shared machine's speed falls on both); each side's
  best round counts. The first job of a new cluster is printed apart, both in
  ``sluice run`` and on that cluster: it is submitted as soon as the TaskManager registered,
  so it also waits for the slot workers to start and make their Spark sessions (1-2.5 s
  before the first split is asked for, measured);
* **the whole process**, cold: ``sluice run`` starting its own embedded cluster and Spark
  server, against a plain PySpark script in a fresh process starting its own local Spark.

Beside them, the peer: **Dask** (``dask.bag``, the same tokenisation, 2 single-thread worker
processes), its whole process cold and its job (read, count, write Parquet) timed inside it.

The Sluice job runs without queryable state (``-p queryable=no``), so both sides do the
same work, with its splits planned as a user's would be (no ``split_bytes``: chosen from
the input's size and the readers); where the job's time went is printed from its own facts.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from rich.table import Table

from sluice.services.jobs.state import JobRun
from sluice.store import EventLog

from .cluster import BenchCluster, finished_run, job_seconds, share_env
from .console import console
from .corpus import write_corpus

__all__ = ["run"]

ROOT = Path(__file__).resolve().parents[2]
TARGET = 1.2
ROUNDS = 3
"""Rounds of the job, each plain PySpark then Sluice; each side's best counts."""


def cold_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for a fresh process timed cold: nothing of this process's Spark Connect client
    (pyspark marks the environment when a remote session is made) may reach it."""
    drop = ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE", "SLUICE_SPARK_REMOTE")
    return {k: v for k, v in env.items() if k not in drop}


def plain(spark, source: str, output: str) -> float:
    sys.path.insert(0, str(ROOT / "examples"))
    import wordcount  # type: ignore[import-not-found]  # examples/wordcount.py, on sys.path from the line above

    t = time.perf_counter()
    words = wordcount.tokenize(spark.read.text(source))
    wordcount.count(words).write.mode("overwrite").parquet(output)
    return time.perf_counter() - t


PLAIN_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    from pyspark.sql import SparkSession
    import wordcount
    spark = SparkSession.builder.master(sys.argv[2]).config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    wordcount.count(wordcount.tokenize(spark.read.text(sys.argv[3]))).write.mode("overwrite").parquet(sys.argv[4])
    spark.stop()
""")


DASK_SCRIPT = textwrap.dedent("""
    import re
    import sys
    import time

    import dask
    import dask.bag as db
    import pyarrow as pa
    import pyarrow.parquet as pq

    SPLIT = re.compile(r"[^a-z0-9']+")


    def words(line):
        return [w for w in SPLIT.split(line.lower()) if w]


    if __name__ == "__main__":
        source, output, workers, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        t = time.perf_counter()
        lines = db.read_text(source, blocksize=-(-size // (2 * workers)), encoding="utf-8")
        with dask.config.set(scheduler="processes", num_workers=workers):
            counts = lines.map(words).flatten().frequencies().compute()
        pq.write_table(pa.table({"word": [w for w, _ in counts], "count": [c for _, c in counts]}), output)
        print(time.perf_counter() - t)
""")
"""Dask's word count: ``dask.bag`` on ``workers`` single-thread processes (the multiprocessing
scheduler), the same tokenisation as ``examples/wordcount.py``; prints its job's seconds."""


def _dask(tmp: Path, source: Path, output: Path, workers: int, env: dict[str, str]) -> tuple[float, float]:
    """Dask's (whole process, job) seconds, cold (a fresh process)."""
    script = tmp / "dask_wordcount.py"
    script.write_text(DASK_SCRIPT)
    cmd = [sys.executable, str(script), str(source), str(output), str(workers), str(source.stat().st_size)]
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp)
    took = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"the Dask script failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return took, float(proc.stdout.strip().splitlines()[-1])


def _params(source: Path, output: Path, parallelism: int, size: int) -> dict[str, str]:
    """The job's parameters: as many reducers as readers, no queryable state, the split size
    left to the plan (``size`` unused: no tuning)."""
    del size
    return {
        "input": str(source),
        "output": str(output),
        "parallelism": str(parallelism),
        "reducers": str(parallelism),
        "queryable": "no",
    }


def _sluice_cmd(home: Path, source: Path, output: Path, parallelism: int, slots: int, size: int) -> list[str]:
    params = [arg for k, v in _params(source, output, parallelism, size).items() for arg in ("-p", f"{k}={v}")]
    return [
        sys.executable,
        "-m",
        "sluice",
        "--home",
        str(home),
        "run",
        str(ROOT / "examples" / "wordcount.py"),
        *params,
        "--slots",
        str(slots),
    ]


class WarmCluster:
    """A cluster (a JobManager, a TaskManager of ``slots`` slots) whose workers use the Spark
    server at ``url``, running the word count again and again: the first run finds the
    workers' Spark sessions new; the later ones are the like-for-like of a warm plain session."""

    def __init__(self, cluster: BenchCluster, parallelism: int) -> None:
        self.cluster = cluster
        self.parallelism = parallelism
        self.last: JobRun | None = None

    def run(self, source: Path, output: Path) -> float:
        """One run: seconds from SubmitJob to FINISHED, by the log's clock."""
        from sluice.client import load_job

        run = self.cluster.run_job(
            load_job(
                ROOT / "examples" / "wordcount.py", _params(source, output, self.parallelism, source.stat().st_size)
            )
        )
        self.last = run
        return job_seconds(run)

    def vertex_times(self) -> dict[str, float]:
        """The last run's task time per vertex."""
        if self.last is None:
            raise RuntimeError("no run yet")
        return _vertex_times(self.cluster.log, self.last)


@contextlib.contextmanager
def warm_cluster(
    url: str, home: Path, parallelism: int, slots: int, master: str | None = None
) -> Iterator[WarmCluster]:
    """A warm cluster on the server at ``url``; given the server's ``master``, its tasks get the
    Spark partitions they get in ``sluice run`` (``taskmanager.share``), else Spark decides."""
    with BenchCluster(home) as cluster:
        cluster.start("tm-0", slots, url, env=share_env(master, slots) if master else None)
        yield WarmCluster(cluster, parallelism)


def _timed(cmd: list[str], env: dict[str, str], cwd: Path, what: str) -> float:
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=cwd)
    took = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return took


def _one(spark, url: str, master: str, tmp: Path, corpus: str, megabytes: int, parallelism: int, slots: int) -> dict:
    case = tmp / f"{corpus}-{megabytes}"  # every output of this case apart from the other cases'
    case.mkdir()
    source = case / "input.txt"
    with console.status(f"generating {megabytes} MB of the {corpus} corpus"):
        write_corpus(corpus, source, megabytes)
    size = source.stat().st_size
    env = {**os.environ, "SLUICE_LOG_LEVEL": "WARNING"}
    home, out = case / "home", case / "sluice-out"
    with console.status(f"sluice run on the warm server ({corpus}, {megabytes} MB)"):
        _timed(
            _sluice_cmd(home, source, out, parallelism, slots, size),
            {**env, "SLUICE_SPARK_REMOTE": url, **share_env(master, slots)},
            tmp,
            "sluice run",
        )
    first_s = _job_time(home)
    outs = [case / f"warm-out-{i}" for i in range(ROUNDS + 1)]
    plains, jobs = [], []
    with warm_cluster(url, case / "warm-home", parallelism, slots, master) as cluster:
        with console.status(f"the first job on a new cluster, plain PySpark's warm-up ({corpus}, {megabytes} MB)"):
            warm_first = cluster.run(source, outs[0])
            plain(spark, str(source), str(case / "plain-warm-up"))  # warm the code paths
        # Turn about, so that a change in the machine's speed (shared cores) falls on both.
        for i in range(ROUNDS):
            with console.status(f"round {i + 1} of {ROUNDS}: plain PySpark, then Sluice ({corpus}, {megabytes} MB)"):
                plains.append(plain(spark, str(source), str(case / f"plain-{i}")))
                jobs.append(cluster.run(source, outs[i + 1]))
        stages = cluster.vertex_times()
    script = tmp / "plain_wordcount.py"
    script.write_text(PLAIN_SCRIPT)
    with console.status(f"plain PySpark script, cold process ({corpus}, {megabytes} MB)"):
        cold_plain = _timed(
            [
                sys.executable,
                str(script),
                str(ROOT / "examples"),
                f"local[{parallelism}]",
                str(source),
                str(case / "plain-cold"),
            ],
            cold_env(env),
            tmp,
            "the plain PySpark script",
        )
    with console.status(f"sluice run, cold process ({corpus}, {megabytes} MB)"):
        cold = _timed(
            _sluice_cmd(case / "cold-home", source, case / "sluice-cold", parallelism, slots, size),
            cold_env(env),
            tmp,
            "sluice run (cold)",
        )
    dask_runs = []
    for i in range(2):
        with console.status(f"Dask, cold process, run {i + 1} of 2 ({corpus}, {megabytes} MB)"):
            dask_runs.append(_dask(tmp, source, case / f"dask-{i}.parquet", parallelism, cold_env(env)))
    want = _summary(spark, case / "plain-0")
    for result in (out, *outs, case / "sluice-cold", case / "dask-0.parquet"):
        if (got := _summary(spark, result)) != want:
            raise RuntimeError(
                f"sluice's result {result} has {got[0]} words counting {got[1]}, plain PySpark's "
                f"{want[0]} counting {want[1]}"
            )
    return {
        "corpus": corpus,
        "mb": size / 1e6,
        "distinct": want[0],
        "plain": min(plains),
        "job": min(jobs),
        "pairs": [j / p for p, j in zip(plains, jobs)],
        "first": first_s,
        "warm_first": warm_first,
        "cold_plain": cold_plain,
        "cold": cold,
        "dask": min(d[0] for d in dask_runs),
        "dask_job": min(d[1] for d in dask_runs),
        "stages": stages,
    }


def _summary(spark, path: Path) -> tuple[int, int]:
    """A word count's distinct words and the sum of its counts."""
    from pyspark.sql import functions as F

    row = spark.read.parquet(str(path)).agg(F.count(F.lit(1)), F.sum("count")).first()
    return int(row[0]), int(row[1] or 0)


def run(
    *,
    megabytes: Sequence[int] = (60,),
    corpora: Sequence[str] = ("small", "zipf"),
    parallelism: int = 2,
    slots: int = 2,
) -> list[dict]:
    from pyspark.sql import SparkSession

    from sluice.services.embedded.spark_connect import SparkConnectServer

    rows = []
    with tempfile.TemporaryDirectory(prefix="sluice-bench-wc-") as tmp:
        tmp_path = Path(tmp)
        master = f"local[{os.cpu_count() or 2}]"
        server = SparkConnectServer(master=master, log_file=tmp_path / "spark.log")
        with console.status("starting Spark"):
            url = server.start()
            spark = SparkSession.builder.remote(url).getOrCreate()
            spark.range(10).count()  # warm
        try:
            for corpus in corpora:
                for mb in megabytes:
                    rows.append(_one(spark, url, master, tmp_path, corpus, mb, parallelism, slots))
        finally:
            spark.stop()
            server.stop()
    table = Table(
        title=f"Word count: Sluice vs plain PySpark, {slots} slots, parallelism {parallelism} "
        f"(issue 11's P7: each ratio <= {TARGET})"
    )
    for col in (
        "corpus",
        "MB",
        "distinct words",
        "plain job s",
        "Sluice job s",
        "job ratio",
        "first job s",
        "plain script s",
        "sluice run s",
        "process ratio",
        "Dask process s / job s",
        "vs Dask process / job",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        job_ratio, cold_ratio = r["job"] / r["plain"], r["cold"] / r["cold_plain"]
        table.add_row(
            r["corpus"],
            f"{r['mb']:,.0f}",
            f"{r['distinct']:,}",
            f"{r['plain']:.2f}",
            f"{r['job']:.2f}",
            f"{'[green]' if job_ratio <= TARGET else '[red]'}{job_ratio:.2f}[/]",
            f"{r['first']:.1f} / {r['warm_first']:.1f}",
            f"{r['cold_plain']:.1f}",
            f"{r['cold']:.1f}",
            f"{'[green]' if cold_ratio <= TARGET else '[red]'}{cold_ratio:.2f}[/]",
            f"{r['dask']:.1f} / {r['dask_job']:.1f}",
            f"{'[green]' if r['cold'] <= r['dask'] else '[red]'}{r['cold'] / r['dask']:.2f}[/] / "
            f"{'[green]' if r['job'] <= r['dask_job'] else '[red]'}{r['job'] / r['dask_job']:.2f}[/]",
        )
    console.print(table)
    console.print(
        f"job: SubmitJob -> FINISHED on a warm cluster against one warm plain session on the same warm "
        f"Spark Connect server, best of {ROUNDS} rounds (each plain, then Sluice) after a first run of "
        "each. first job: the first job of a new cluster, in `sluice run` / on the warm cluster, submitted "
        "as soon as its TaskManager registered (its slot workers still start, and make their Spark "
        "sessions). process: `sluice run` starting its own cluster and Spark, against a plain script "
        "starting its own local Spark, both cold. Dask: dask.bag, the same tokenisation, "
        f"{parallelism} single-thread worker processes, cold, best of 2 (its job: read, count, write "
        "Parquet, timed inside it). Each Sluice task read and shuffled into "
        f"{_share(master, slots, parallelism)} Spark partition(s): its share of the server's {master} "
        "(services/taskmanager/share.py).",
        style="dim",
    )
    for r in rows:
        console.print(
            f"  {r['corpus']} {r['mb']:,.0f} MB, each round's ratio (Sluice / the plain run just before): "
            + ", ".join(f"{x:.2f}" for x in r["pairs"]),
            style="dim",
        )
        for name, seconds in r["stages"].items():
            console.print(f"  {r['corpus']} {r['mb']:,.0f} MB, last round, {name}: {seconds:.1f} s", style="dim")
    return rows


def _share(master: str, slots: int, parallelism: int) -> str:
    from sluice.services.taskmanager.share import local_cores, task_partitions

    cores = local_cores(master)
    return "Spark's choice of" if cores is None else str(task_partitions(cores, slots, parallelism))


def _job_time(home: Path) -> float:
    """The duration of the one job of a finished ``sluice run`` in ``home``, from its facts."""
    with finished_run(home) as (_, job):
        return job_seconds(job)


def _vertex_times(log: EventLog, job: JobRun) -> dict[str, float]:
    """Per vertex, its tasks' time RUNNING -> FINISHED, summed, from the job's facts."""
    from sluice.events import TaskState, UpdateTaskExecutionState

    running: dict[str, int] = {}
    stages: dict[str, float] = {}
    for _, env_ in log.replay(log.keys.facts(log.keys.job(job.job_id))):
        ev = env_.event
        if isinstance(ev, UpdateTaskExecutionState):
            if ev.state == TaskState.RUNNING:
                running[ev.execution_id] = env_.ts
            elif ev.state == TaskState.FINISHED and ev.execution_id in running:
                key = f"{ev.vertex_id}: task time, summed"
                stages[key] = stages.get(key, 0.0) + (env_.ts - running[ev.execution_id]) / 1000
    return stages
