"""Word count on generated text: ``sluice run examples/wordcount.py`` vs the same
transformations in one plain PySpark session, on the same warm Spark Connect server.

Reports the ratio Sluice/plain for the whole ``sluice run`` (embedded cluster start and
stop included) and for the job alone (SubmitJob to FINISHED), and where the job's time
went, from the job's own facts.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

__all__ = ["run", "generate"]

console = Console()
ROOT = Path(__file__).resolve().parents[2]


def generate(path: Path, megabytes: int, seed: int = 1) -> None:
    """Random lines of words from a 5,000-word vocabulary with a skewed frequency."""
    rng = random.Random(seed)
    vocab = [f"w{i}" + "".join(rng.choice("abcdefghij") for _ in range(rng.randint(1, 6))) for i in range(5000)]
    weights = [1.0 / (i + 1) for i in range(len(vocab))]
    block = "\n".join(" ".join(rng.choices(vocab, weights, k=rng.randint(3, 15))) for _ in range(20000)) + "\n"
    data = block.encode()
    with path.open("wb") as f:
        for _ in range(max(1, megabytes * 1024 * 1024 // len(data))):
            f.write(data)


def plain(spark, source: str, output: str) -> float:
    sys.path.insert(0, str(ROOT / "examples"))
    import wordcount  # type: ignore[import-not-found]  # examples/wordcount.py, on sys.path from the line above

    t = time.perf_counter()
    words = wordcount.tokenize(spark.read.text(source))
    wordcount.count(words).write.mode("overwrite").parquet(output)
    return time.perf_counter() - t


def run(*, megabytes: int = 200, parallelism: int = 2, slots: int = 2) -> dict[str, float]:
    from pyspark.sql import SparkSession

    from sluice.services.embedded.spark_connect import SparkConnectServer

    with tempfile.TemporaryDirectory(prefix="sluice-bench-wc-") as tmp:
        tmp_path = Path(tmp)
        source = tmp_path / "input.txt"
        with console.status(f"generating {megabytes} MB of text"):
            generate(source, megabytes)
        size = source.stat().st_size
        server = SparkConnectServer(master=f"local[{os.cpu_count() or 2}]", log_file=tmp_path / "spark.log")
        with console.status("starting Spark"):
            url = server.start()
            spark = SparkSession.builder.remote(url).getOrCreate()
            spark.range(10).count()  # warm
        try:
            with console.status("plain PySpark"):
                plain(spark, str(source), str(tmp_path / "warm"))  # warm the code paths
                base = min(plain(spark, str(source), str(tmp_path / f"plain-{i}")) for i in range(2))
            split = max(size // parallelism + 1, 1 << 20)
            env = {**os.environ, "SLUICE_SPARK_REMOTE": url, "SLUICE_LOG_LEVEL": "WARNING"}
            cmd = [sys.executable, "-m", "sluice", "--home", str(tmp_path / "home"), "run",
                   str(ROOT / "examples" / "wordcount.py"), "-p", f"input={source}",
                   "-p", f"output={tmp_path / 'sluice-out'}", "-p", f"parallelism={parallelism}",
                   "-p", f"reducers={parallelism}", "-p", f"split_bytes={split}", "--slots", str(slots)]
            with console.status("sluice run"):
                t = time.perf_counter()
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp)
                total = time.perf_counter() - t
            if proc.returncode != 0:
                raise RuntimeError(f"sluice run failed:\n{proc.stdout}\n{proc.stderr}")
            job_s, stages = _job_times(tmp_path / "home", env)
            got = spark.read.parquet(str(tmp_path / "sluice-out")).count()
            want = spark.read.parquet(str(tmp_path / "plain-0")).count()
            if got != want:
                raise RuntimeError(f"sluice's result has {got} words, plain PySpark's {want}")
        finally:
            spark.stop()
            server.stop()
    table = Table(title=f"Word count, {size / 1e6:,.0f} MB of text, {slots} slots, same warm Spark Connect server")
    for col in ("run", "seconds", "Sluice/plain", "target"):
        table.add_column(col, justify="right")
    table.add_row("plain PySpark (one session)", f"{base:.1f}", "", "")
    table.add_row("Sluice: the job (SubmitJob -> FINISHED)", f"{job_s:.1f}", f"{job_s / base:.2f}", "<= 1.5")
    table.add_row("Sluice: all of `sluice run` (cluster start/stop too)", f"{total:.1f}", f"{total / base:.2f}", "")
    console.print(table)
    for name, seconds in stages.items():
        console.print(f"  {name}: {seconds:.1f} s", style="dim")
    return {"plain": base, "job": job_s, "run": total}


def _job_times(home: Path, env: dict) -> tuple[float, dict[str, float]]:
    """Job duration and per-vertex task time (RUNNING -> FINISHED), from the job's facts."""
    from sluice.client import Client
    from sluice.events import TaskState, UpdateTaskExecutionState
    from sluice.services.embedded import EmbeddedCluster
    from sluice.store import EventLog, Keys, connect

    cluster = EmbeddedCluster(home)
    log = EventLog(connect(cluster.redis_url()), Keys("sluice"))
    try:
        client = Client(log)
        (job_id,) = client.job_ids()
        job = client.job(job_id)
        running: dict[str, int] = {}
        stages: dict[str, float] = {}
        for _, env_ in log.replay(log.keys.facts(log.keys.job(job_id))):
            ev = env_.event
            if isinstance(ev, UpdateTaskExecutionState):
                if ev.state == TaskState.RUNNING:
                    running[ev.execution_id] = env_.ts
                elif ev.state == TaskState.FINISHED and ev.execution_id in running:
                    key = f"{ev.vertex_id}: task time, summed"
                    stages[key] = stages.get(key, 0.0) + (env_.ts - running[ev.execution_id]) / 1000
        assert job.ended_at is not None  # `sluice run` returned 0: the job ended
        return (job.ended_at - job.submitted_at) / 1000, stages
    finally:
        cluster.stop_redis()
