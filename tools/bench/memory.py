"""Memory of the embedded cluster: ``sluice cluster start -n N -s S``, the README's word
count submitted and run to its end (so every slot worker and Spark server is warm), then
the resident memory (RSS, from /proc) of each process: Redis, the JobManager, the
projector, and per TaskManager its own process, its slot workers and its Spark Connect
server (the JVM and the Python workers under it). The baseline, measured in the same run:
a plain PySpark script running the same word count in one process (its driver and JVM).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Self

from rich.table import Table

from .console import console

__all__ = ["run", "rss_mb", "process_tree", "PeakRss"]

ROOT = Path(__file__).resolve().parents[2]


def rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` in MB (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0.0


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    from sluice.services.embedded.supervisor import descendants

    return [pid, *descendants([pid])]


class Sampler:
    """Calls ``sample`` every ``every`` seconds on a thread of its own while the ``with``
    block runs (what a bench watches beside the process it times)."""

    def __init__(self, every: float) -> None:
        self.every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def sample(self) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.every)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class PeakRss(Sampler):
    """The peak of the summed RSS of some process trees (MB), sampled every ``every`` seconds
    while the ``with`` block runs."""

    def __init__(self, roots: Sequence[int], every: float = 0.05) -> None:
        super().__init__(every)
        self.roots, self.peak = list(roots), 0.0

    def sample(self) -> None:
        pids = {p for root in self.roots for p in process_tree(root)}
        self.peak = max(self.peak, sum(rss_mb(p) for p in pids))


def _cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except FileNotFoundError:
        return ""


def run(*, taskmanagers: int = 2, slots: int = 2) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="sluice-bench-mem-") as tmp:
        home = Path(tmp) / "home"
        sluice = [sys.executable, "-m", "sluice", "--home", str(home)]
        env = {**os.environ, "SLUICE_LOG_LEVEL": "WARNING"}
        out: dict[str, float] = {}
        try:
            with console.status(f"cluster start -n {taskmanagers} -s {slots}"):
                subprocess.run(
                    [*sluice, "cluster", "start", "-n", str(taskmanagers), "-s", str(slots)],
                    env=env,
                    check=True,
                    capture_output=True,
                    cwd=tmp,
                )
            with console.status("submit examples/wordcount.py --wait"):
                subprocess.run(
                    [*sluice, "submit", str(ROOT / "examples" / "wordcount.py"), "--wait"],
                    env=env,
                    check=True,
                    capture_output=True,
                    cwd=tmp,
                )
            data = json.loads((home / "cluster.json").read_text())
            table = Table(
                title=f"Resident memory of the embedded cluster (-n {taskmanagers} -s {slots}), after the "
                "word count ran"
            )
            for col in ("process", "MB"):
                table.add_column(col, justify="right" if col == "MB" else "left")
            redis_mb = rss_mb(int(data["redis"]["pid"]))
            table.add_row("redis-server", f"{redis_mb:.0f}")
            total = redis_mb
            per_tm, per_slot, spark_mb = [], [], []
            for p in data.get("processes", []):
                pid, role, name = int(p["pid"]), p["role"], p["name"]
                if role != "taskmanager":
                    mb = rss_mb(pid)
                    table.add_row(f"{role} {name}", f"{mb:.0f}")
                    total += mb
                    continue
                own = rss_mb(pid)
                workers = spark = 0.0
                for child in process_tree(pid)[1:]:
                    cmd = _cmd(child)
                    if (
                        "java" in cmd.split(" ", 1)[0]
                        or "org.apache.spark" in cmd
                        or "pyspark.daemon" in cmd
                        or "pyspark.worker" in cmd
                    ):
                        spark += rss_mb(child)
                    elif "sluice" in cmd and "worker" in cmd:
                        mb = rss_mb(child)
                        workers += mb
                        per_slot.append(mb)
                table.add_row(
                    f"taskmanager {name}: its process / slot workers / Spark server",
                    f"{own:.0f} / {workers:.0f} / {spark:.0f}",
                )
                per_tm.append(own + workers + spark)
                spark_mb.append(spark)
                total += own + workers + spark
            if data.get("spark"):  # a Spark server shared by the cluster, when it runs one
                shared = sum(rss_mb(q) for q in process_tree(int(data["spark"]["pid"])))
                table.add_row("shared Spark Connect server", f"{shared:.0f}")
                total += shared
            table.add_row("[b]whole cluster[/b]", f"[b]{total:.0f}[/b]")
            if per_tm:
                table.add_row("per TaskManager (all its processes), mean", f"{sum(per_tm) / len(per_tm):.0f}")
            if per_slot:
                table.add_row("per slot (its worker), mean", f"{sum(per_slot) / len(per_slot):.0f}")
            with console.status("plain PySpark script"):
                base = _plain(Path(tmp))
            table.add_row("baseline: a plain PySpark script's process tree (driver + JVM), peak", f"{base:.0f}")
            console.print(table)
            out = {
                "cluster": total,
                "per_taskmanager": sum(per_tm) / max(len(per_tm), 1),
                "per_slot": sum(per_slot) / max(len(per_slot), 1),
                "spark_server": sum(spark_mb) / max(len(spark_mb), 1),
                "plain": base,
            }
        finally:
            subprocess.run([*sluice, "cluster", "stop"], env=env, capture_output=True, cwd=tmp)
        return out


def _plain(tmp: Path) -> float:
    """Peak RSS of a plain PySpark script's tree running the word count (its JVM is a child)."""
    script = tmp / "plain.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        sys.path.insert(0, {str(ROOT / "examples")!r})
        import wordcount
        from pyspark.sql import SparkSession
        from tools.bench.memory import PeakRss
        import os
        with PeakRss([os.getpid()], every=0.2) as rss:
            spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
            text = Path({str(tmp / "wc.txt")!r})
            wordcount.generate(text)
            words = wordcount.tokenize(spark.read.text(str(text)))
            wordcount.count(words).write.mode("overwrite").parquet({str(tmp / "plain-out")!r})
            time.sleep(0.5)
        print(rss.peak)
        spark.stop()
    """)
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True)
    return float(proc.stdout.strip().splitlines()[-1])
