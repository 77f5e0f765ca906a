"""Balance of the Spark work across readers: a job whose Spark work is
``--slow`` times slower on one of two readers, with the source read whole (the default: a
reader copies every split it gets, then runs its functions once) and read ``each_split``
(the functions run on each split as it arrives), on one cluster (a JobManager, a TaskManager
of two slots) whose workers use one warm Spark Connect server. Each mode runs twice (whole,
each_split, whole, each_split): the later run is the measure (a long-lived cluster's workers
have their Spark sessions); the earlier one is printed too.

For each it reports how many splits each reader took, and how long reading took (the source
tasks, first RUNNING to last FINISHED) against the ideal: the work alone (rows x cost a row,
known from the job's settings) shared by the readers in proportion to their speeds, with no
overhead (issue 11's target: reading within 1.3x of it).

With ``taskmanagers=2`` the readers run on two TaskManagers of one slot each (issue 11: "on
two TaskManagers, neither is idle while the other holds splits it has not started"), and
the bench prints how long each reader was idle at the end of reading, and for how much of
that the other held splits it had not started (``idle``).
"""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

from rich.table import Table

from sluice.events import Envelope
from sluice.store import EventLog

from .console import console

__all__ = ["run"]

JOB = Path(__file__).with_name("balance_job.py")


def run(
    *, splits: int = 16, rows_per_split: int = 2000, work_s: float = 1.0, slow: float = 5.0, taskmanagers: int = 1
) -> dict:
    """``taskmanagers``: 1 (one TaskManager of two slots) or 2 (two of one slot each)."""
    from pyspark.sql import SparkSession

    from sluice.client import load_job
    from sluice.services.embedded.spark_connect import SparkConnectServer

    from .cluster import BenchCluster, job_seconds, share_env

    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="sluice-bench-balance-") as tmp:
        tmp_path = Path(tmp)
        source = tmp_path / "input.txt"
        lines = [f"line {i:08d}" for i in range(splits * rows_per_split)]
        source.write_text("\n".join(lines) + "\n")
        split_bytes = (len(lines[0]) + 1) * rows_per_split
        master = "local[2]"
        server = SparkConnectServer(master=master, log_file=tmp_path / "spark.log")
        with console.status("starting Spark"):
            url = server.start()
            spark = SparkSession.builder.remote(url).getOrCreate()
            spark.range(10).count()
        env = {
            "SLUICE_BENCH_WORK_S_PER_ROW": str(work_s / rows_per_split),
            "SLUICE_BENCH_SLOW_FACTOR": str(slow),
            **share_env(master, 2),
        }  # as `sluice run` gives its tasks (two slots on the server)
        try:
            with BenchCluster(tmp_path / "home") as cluster:
                if taskmanagers == 1:
                    cluster.start("tm-0", 2, url, env=env)
                else:
                    cluster.start("tm-0", 1, url, env=env)
                    cluster.add_taskmanager("tm-1", 1, url, env=env)
                # Each mode twice on one cluster: whole, each_split, then both again. The first
                # two are the cluster's start (its workers start their Spark sessions, and a
                # session's first Python UDF its Python workers: 1.5-1.8 s here); the last two
                # are the measure, as a long-lived cluster runs a job.
                for run_no, mode in enumerate(("whole", "each_split") * 2):
                    params = {
                        "input": str(source),
                        "output": str(tmp_path / f"{mode}-{run_no}"),
                        "parallelism": "2",
                        "split_bytes": str(split_bytes),
                        "each_split": "yes" if mode == "each_split" else "no",
                    }
                    with console.status(f"source read {mode}, {'first' if run_no < 2 else 'second'} run"):
                        job = cluster.run_job(load_job(JOB, params))
                    total = job_seconds(job)
                    got = spark.read.parquet(params["output"]).count()
                    if got != len(lines):
                        raise RuntimeError(f"{mode}: {got} rows written, the input has {len(lines)}")
                    reading = _reading(cluster.log, job.job_id, whole=mode == "whole")
                    if run_no < 2:
                        out[mode] = {"first": reading["reading"]}
                    else:
                        out[mode].update(reading, run=total)
        finally:
            spark.stop()
            server.stop()
    n = sum(out["whole"]["splits"].values())
    ideal = n * work_s / (1 + 1 / slow)  # the fast reader does 1 split-of-work a unit of time, the slow 1/slow
    where = "one TaskManager of two slots" if taskmanagers == 1 else "two TaskManagers of one slot each"
    table = Table(
        title=f"Balance: 2 readers on {where}, one {slow:g}x slower at the Spark work; {n} splits of "
        f"{rows_per_split:,} rows, {work_s:g} s of work a split on the fast reader"
    )
    for col in (
        "source read",
        "splits: slow / fast",
        "slow's share (ideal)",
        "held back",
        "reading",
        "ideal (work only)",
        "reading / ideal",
        "target",
        "job",
        "earlier run: reading",
    ):
        table.add_column(col, justify="right")
    for mode, r in out.items():
        s, f = r["splits"].get(0, 0), r["splits"].get(1, 0)
        held = ", ".join(f"{'slow' if sub == 0 else 'fast'} ({n} left)" for sub, n in sorted(r["held"].items()))
        table.add_row(
            mode,
            f"{s} / {f}",
            f"{s / max(s + f, 1):.2f} ({1 / (1 + slow):.2f})",
            held or "-",
            f"{r['reading']:.1f} s",
            f"{ideal:.1f} s",
            f"{r['reading'] / ideal:.2f}",
            "<= 1.3",
            f"{r['run']:.1f} s",
            f"{r['first']:.1f} s ({r['first'] / ideal:.2f})",
        )
    console.print(table)
    for mode, r in out.items():
        console.print(
            f"  {mode}: "
            + "; ".join(
                f"{'slow' if sub == 0 else 'fast'} reader on {r['on'].get(sub, '?')}, idle at the end {idle:.1f} s, "
                f"of which the other held splits it had not started {unstarted:.1f} s"
                for sub, (idle, unstarted) in sorted(r["idle"].items())
            ),
            style="dim",
        )
    console.print(
        "The ideal leaves out what a Spark job costs (each_split runs one a split; whole one a reader). "
        "Each mode ran twice on one cluster (whole, each_split, whole, each_split); the later run is the "
        "measure, the earlier one the last column (the cluster's first run, read whole, also started "
        'its workers\' Spark sessions and Python workers). held back: a reader told "no more" while '
        "splits were left (the end game: the other reader would finish them sooner), and how many were "
        "handed out after. job: SubmitJob -> FINISHED.",
        style="dim",
    )
    return out


def _reading(log: EventLog, job_id: str, *, whole: bool) -> dict:
    """Splits per source subtask, the readers held back (told "no more" while splits were
    left: how many were handed out after), seconds from the first source task RUNNING to
    the last FINISHED, where each reader ran, and how idle each was (``idle``)."""
    from sluice.events import TaskState, UpdateTaskExecutionState
    from sluice.services.coordination.timeline import held_back, split_timeline

    envs = [env for _, env in log.replay(log.keys.facts(log.keys.job(job_id)))]
    rows = split_timeline(envs)
    splits = Counter(r.subtask for r in rows if r.outcome == "finished")
    source = rows[0].vertex if rows else ""
    states = [
        (e.ts, e.event) for e in envs if isinstance(e.event, UpdateTaskExecutionState) and e.event.vertex_id == source
    ]
    began = [ts for ts, ev in states if ev.state == TaskState.RUNNING]
    ended = [ts for ts, ev in states if ev.state == TaskState.FINISHED]
    held = {subtask: n for (vertex, subtask, _), n in held_back(envs).items() if vertex == source}
    on = {ev.subtask: ev.taskmanager for _, ev in states if ev.taskmanager}
    return {
        "splits": dict(splits),
        "held": held,
        "reading": (max(ended) - min(began)) / 1000,
        "on": on,
        "idle": idle(envs, source, whole=whole),
    }


def idle(envs: list[Envelope], source: str, *, whole: bool) -> dict[int, tuple[float, float]]:
    """Per subtask of ``source`` (its attempt that finished): seconds from its FINISHED to the
    last one's (idle at the end of reading), and how many of those another subtask held
    splits it had not started. Read whole, a reader starts its Spark work once told "no
    more": every split it holds until then is unstarted. Read each_split, it works on each
    split as it arrives and asks for the next when done, so it never holds one unstarted."""
    from sluice.events import TaskState, UpdateTaskExecutionState
    from sluice.services.coordination.timeline import split_timeline, told_no_more

    finished = {
        e.event.subtask: (e.event.attempt, e.ts)
        for e in envs
        if isinstance(e.event, UpdateTaskExecutionState)
        and e.event.vertex_id == source
        and e.event.state == TaskState.FINISHED
    }
    if not finished:
        return {}
    end = max(ts for _, ts in finished.values())
    holding: dict[int, tuple[int, int]] = {}  # subtask -> (first split received, told no more), read whole
    if whole:
        told = told_no_more(envs)
        for row in split_timeline(envs):
            attempt = finished.get(row.subtask, (None, 0))[0]
            if row.vertex == source and row.attempt == attempt and (source, row.subtask, attempt) in told:
                holding.setdefault(row.subtask, (row.at, told[(source, row.subtask, attempt)]))  # (rows in log order)
    out = {}
    for sub, (_, done) in finished.items():
        unstarted = sum(
            max(0, min(end, until) - max(done, since)) for other, (since, until) in holding.items() if other != sub
        )
        out[sub] = ((end - done) / 1000, unstarted / 1000)
    return out
