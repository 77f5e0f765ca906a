"""Balance of the Spark work across readers: ``sluice run`` of a job whose Spark work is
``--slow`` times slower on one of two readers, with the source read whole (the default: a
reader copies every split it gets, then runs its functions once) and read ``each_split``
(the functions run on each split as it arrives), on the same warm Spark Connect server.

For each it reports how many splits each reader took, and how long reading took (the source
tasks, first RUNNING to last FINISHED) against the ideal: the work alone (rows x cost a row,
known from the job's settings) shared by the readers in proportion to their speeds, with no
overhead (issue 11's target: reading within 1.3x of it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

__all__ = ["run"]

console = Console()
JOB = Path(__file__).with_name("balance_job.py")


def run(*, splits: int = 16, rows_per_split: int = 2000, work_s: float = 1.0, slow: float = 5.0) -> dict:
    from pyspark.sql import SparkSession

    from sluice.services.embedded.spark_connect import SparkConnectServer

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
        try:
            env = {**os.environ, "SLUICE_SPARK_REMOTE": url, "SLUICE_LOG_LEVEL": "WARNING",
                   "SLUICE_BENCH_WORK_S_PER_ROW": str(work_s / rows_per_split), "SLUICE_BENCH_SLOW_FACTOR": str(slow)}
            for mode in ("whole", "each_split"):
                home = tmp_path / f"home-{mode}"
                cmd = [sys.executable, "-m", "sluice", "--home", str(home), "run", str(JOB),
                       "-p", f"input={source}", "-p", f"output={tmp_path / mode}", "-p", "parallelism=2",
                       "-p", f"split_bytes={split_bytes}", "-p", f"each_split={'yes' if mode == 'each_split' else 'no'}",
                       "--slots", "2"]
                with console.status(f"sluice run, source read {mode}"):
                    t = time.perf_counter()
                    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp)
                    total = time.perf_counter() - t
                if proc.returncode != 0:
                    raise RuntimeError(f"sluice run ({mode}) failed:\n{proc.stdout}\n{proc.stderr}")
                got = spark.read.parquet(str(tmp_path / mode)).count()
                if got != len(lines):
                    raise RuntimeError(f"{mode}: {got} rows written, the input has {len(lines)}")
                out[mode] = {**_reading(home), "run": total}
        finally:
            spark.stop()
            server.stop()
    n = sum(out["whole"]["splits"].values())
    ideal = n * work_s / (1 + 1 / slow)  # the fast reader does 1 split-of-work a unit of time, the slow 1/slow
    table = Table(title=f"Balance: 2 readers, one {slow:g}x slower at the Spark work; {n} splits of "
                        f"{rows_per_split:,} rows, {work_s:g} s of work a split on the fast reader")
    for col in ("source read", "splits: slow / fast", "slow's share (ideal)", "reading", "ideal (work only)",
                "reading / ideal", "target", "sluice run"):
        table.add_column(col, justify="right")
    for mode, r in out.items():
        s, f = r["splits"].get(0, 0), r["splits"].get(1, 0)
        table.add_row(mode, f"{s} / {f}", f"{s / max(s + f, 1):.2f} ({1 / (1 + slow):.2f})", f"{r['reading']:.1f} s",
                      f"{ideal:.1f} s", f"{r['reading'] / ideal:.2f}", "<= 1.3", f"{r['run']:.1f} s")
    console.print(table)
    console.print("The ideal leaves out what a Spark job costs (each_split runs one a split; whole one a reader).",
                  style="dim")
    return out


def _reading(home: Path) -> dict:
    """Splits per source subtask, and seconds from the first source task RUNNING to the last FINISHED."""
    from sluice.client import Client
    from sluice.events import TaskState, UpdateTaskExecutionState
    from sluice.services.coordination.timeline import split_timeline
    from sluice.services.embedded import EmbeddedCluster
    from sluice.store import EventLog, Keys, connect

    cluster = EmbeddedCluster(home)
    log = EventLog(connect(cluster.redis_url()), Keys("sluice"))
    try:
        (job_id,) = Client(log).job_ids()
        facts = list(log.replay(log.keys.facts(log.keys.job(job_id))))
        rows = split_timeline(env for _, env in facts)
        splits = Counter(r.subtask for r in rows if r.outcome == "finished")
        source = rows[0].vertex if rows else ""
        began = [e.ts for _, e in facts if isinstance(e.event, UpdateTaskExecutionState)
                 and e.event.vertex_id == source and e.event.state == TaskState.RUNNING]
        ended = [e.ts for _, e in facts if isinstance(e.event, UpdateTaskExecutionState)
                 and e.event.vertex_id == source and e.event.state == TaskState.FINISHED]
        return {"splits": dict(splits), "reading": (max(ended) - min(began)) / 1000}
    finally:
        cluster.stop_redis()
