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
"""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

from rich.table import Table

from sluice.store import EventLog

from .console import console

__all__ = ["run"]

JOB = Path(__file__).with_name("balance_job.py")


def run(*, splits: int = 16, rows_per_split: int = 2000, work_s: float = 1.0, slow: float = 5.0) -> dict:
    from pyspark.sql import SparkSession

    from sluice.client import load_job
    from sluice.services.embedded.spark_connect import SparkConnectServer

    from .cluster import BenchCluster, job_seconds

    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="sluice-bench-balance-") as tmp:
        tmp_path = Path(tmp)
        source = tmp_path / "input.txt"
        lines = [f"line {i:08d}" for i in range(splits * rows_per_split)]
        source.write_text("\n".join(lines) + "\n")
        split_bytes = (len(lines[0]) + 1) * rows_per_split
        server = SparkConnectServer(master="local[2]", log_file=tmp_path / "spark.log")
        with console.status("starting Spark"):
            url = server.start()
            spark = SparkSession.builder.remote(url).getOrCreate()
            spark.range(10).count()
        env = {"SLUICE_BENCH_WORK_S_PER_ROW": str(work_s / rows_per_split), "SLUICE_BENCH_SLOW_FACTOR": str(slow)}
        try:
            with BenchCluster(tmp_path / "home") as cluster:
                cluster.start("tm-0", 2, url, env=env)
                # Each mode twice on one cluster: whole, each_split, then both again. The first
                # two are the cluster's start (its workers start their Spark sessions, and a
                # session's first Python UDF its Python workers: 1.5-1.8 s here); the last two
                # are the measure, as a long-lived cluster runs a job.
                for run_no, mode in enumerate(("whole", "each_split") * 2):
                    params = {"input": str(source), "output": str(tmp_path / f"{mode}-{run_no}"), "parallelism": "2",
                              "split_bytes": str(split_bytes), "each_split": "yes" if mode == "each_split" else "no"}
                    with console.status(f"source read {mode}, {'first' if run_no < 2 else 'second'} run"):
                        job = cluster.run_job(load_job(JOB, params))
                    total = job_seconds(job)
                    got = spark.read.parquet(params["output"]).count()
                    if got != len(lines):
                        raise RuntimeError(f"{mode}: {got} rows written, the input has {len(lines)}")
                    reading = _reading(cluster.log, job.job_id)
                    if run_no < 2:
                        out[mode] = {"first": reading["reading"]}
                    else:
                        out[mode].update(reading, run=total)
        finally:
            spark.stop()
            server.stop()
    n = sum(out["whole"]["splits"].values())
    ideal = n * work_s / (1 + 1 / slow)  # the fast reader does 1 split-of-work a unit of time, the slow 1/slow
    table = Table(title=f"Balance: 2 readers, one {slow:g}x slower at the Spark work; {n} splits of "
                        f"{rows_per_split:,} rows, {work_s:g} s of work a split on the fast reader")
    for col in ("source read", "splits: slow / fast", "slow's share (ideal)", "held back", "reading",
                "ideal (work only)", "reading / ideal", "target", "job", "earlier run: reading"):
        table.add_column(col, justify="right")
    for mode, r in out.items():
        s, f = r["splits"].get(0, 0), r["splits"].get(1, 0)
        held = ", ".join(f"{'slow' if sub == 0 else 'fast'} ({n} left)" for sub, n in sorted(r["held"].items()))
        table.add_row(mode, f"{s} / {f}", f"{s / max(s + f, 1):.2f} ({1 / (1 + slow):.2f})", held or "-",
                      f"{r['reading']:.1f} s",
                      f"{ideal:.1f} s", f"{r['reading'] / ideal:.2f}", "<= 1.3", f"{r['run']:.1f} s",
                      f"{r['first']:.1f} s ({r['first'] / ideal:.2f})")
    console.print(table)
    console.print("The ideal leaves out what a Spark job costs (each_split runs one a split; whole one a reader). "
                  "Each mode ran twice on one cluster (whole, each_split, whole, each_split); the later run is the "
                  "measure, the earlier one the last column (the cluster's first run, read whole, also started "
                  "its workers' Spark sessions and Python workers). held back: a reader told \"no more\" while "
                  "splits were left (the end game: the other reader would finish them sooner), and how many were "
                  "handed out after. job: SubmitJob -> FINISHED.", style="dim")
    return out


def _reading(log: EventLog, job_id: str) -> dict:
    """Splits per source subtask, the readers held back (told "no more" while splits were
    left: how many were handed out after), and seconds from the first source task RUNNING
    to the last FINISHED."""
    from sluice.events import TaskState, UpdateTaskExecutionState
    from sluice.services.coordination.timeline import held_back, split_timeline

    facts = list(log.replay(log.keys.facts(log.keys.job(job_id))))
    rows = split_timeline(env for _, env in facts)
    splits = Counter(r.subtask for r in rows if r.outcome == "finished")
    source = rows[0].vertex if rows else ""
    began = [e.ts for _, e in facts if isinstance(e.event, UpdateTaskExecutionState)
             and e.event.vertex_id == source and e.event.state == TaskState.RUNNING]
    ended = [e.ts for _, e in facts if isinstance(e.event, UpdateTaskExecutionState)
             and e.event.vertex_id == source and e.event.state == TaskState.FINISHED]
    held = {subtask: n for (vertex, subtask, _), n in held_back(e for _, e in facts).items() if vertex == source}
    return {"splits": dict(splits), "held": held, "reading": (max(ended) - min(began)) / 1000}
