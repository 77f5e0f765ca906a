"""Cold start (issue 11): the README's main job from nothing, as a new user runs it, against a
plain PySpark script doing the same transformations, each a fresh process, in one run.

For each way of running it (``sluice run`` on 1 or 2 TaskManagers, with one Spark Connect
server shared by the cluster or one per TaskManager):

* the whole process, against the plain script's (target: at most 1.5x);
* its timeline from the process start: each Spark server listening (polled on the port its
  command line names), the job submitted, the first source subtask asking for a split (a
  worker asks once its Spark session is connected, so this is when Spark work can start),
  the job's end (target: the first split asked for within 2 s of the first server
  listening);
* the peak RSS of the whole process tree: what a second JVM on the host costs.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.table import Table

from .cluster import finished_run
from .console import console
from .memory import PeakRss, Sampler, process_tree
from .wordcount import PLAIN_SCRIPT, ROOT, cold_env

__all__ = ["run", "Variant", "VARIANTS"]

RATIO_TARGET = 1.5
FIRST_TASK_TARGET_S = 2.0
_PORT = re.compile(rb"spark\.connect\.grpc\.binding\.port=(\d+)")


@dataclass(frozen=True)
class Variant:
    taskmanagers: int
    spark_servers: str

    @property
    def name(self) -> str:
        return f"-n {self.taskmanagers} {self.spark_servers}"


VARIANTS = (Variant(1, "shared"), Variant(2, "shared"), Variant(2, "per-taskmanager"))


@dataclass
class Timeline:
    """Seconds from the process start."""

    whole: float
    listening: list[float] = field(default_factory=list)
    submitted: float | None = None
    first_split: float | None = None
    ended: float | None = None
    peak_mb: float = 0.0

    @property
    def first_task_after_listening(self) -> float | None:
        if self.first_split is None or not self.listening:
            return None
        return self.first_split - min(self.listening)


class _SparkWatch(Sampler):
    """Notes when each Spark Connect server below ``pid`` first accepts a connection (wall
    clock), polling every ``every`` seconds."""

    def __init__(self, pid: int, every: float = 0.05) -> None:
        super().__init__(every)
        self.pid = pid
        self.listening: dict[int, float] = {}

    def _ports(self) -> set[int]:
        out = set()
        for p in process_tree(self.pid):
            try:
                found = _PORT.search(Path(f"/proc/{p}/cmdline").read_bytes())
            except OSError:
                continue
            if found:
                out.add(int(found.group(1)))
        return out

    def sample(self) -> None:
        for port in self._ports() - set(self.listening):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.05):
                    self.listening[port] = time.time()
            except OSError:
                pass


def _env() -> dict[str, str]:
    """A new user's environment: no SLUICE_ setting, nothing of this process's Spark client."""
    return {k: v for k, v in cold_env(os.environ).items() if not k.startswith("SLUICE_")}


def plain_process(tmp: Path, source: Path) -> tuple[float, float]:
    """The plain script's whole process (seconds) and its peak RSS (MB)."""
    script = tmp / "plain_wordcount.py"
    script.write_text(PLAIN_SCRIPT)
    t = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, str(script), str(ROOT / "examples"), "local[2]", str(source), str(tmp / "plain-out")],
        env=_env(),
        cwd=tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    with PeakRss([proc.pid], every=0.1) as rss:
        out, _ = proc.communicate()
    took = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"the plain PySpark script failed:\n{out.decode(errors='replace')[-3000:]}")
    return took, rss.peak


def sluice_process(cwd: Path, source: Path, variant: Variant) -> Timeline:
    """``sluice run examples/wordcount.py`` (the default example, with its queryable state)
    in ``cwd``, a directory it makes, and its timeline from the job's own log."""
    cwd.mkdir()
    cmd = [
        sys.executable,
        "-m",
        "sluice",
        "run",
        str(ROOT / "examples" / "wordcount.py"),
        "-p",
        f"input={source}",
        "-n",
        str(variant.taskmanagers),
        "--spark-servers",
        variant.spark_servers,
    ]
    began, t = time.time(), time.perf_counter()
    proc = subprocess.Popen(cmd, env=_env(), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    with PeakRss([proc.pid], every=0.1) as rss, _SparkWatch(proc.pid) as spark:
        out, _ = proc.communicate()
    took = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"sluice run ({variant.name}) failed:\n{out.decode(errors='replace')[-3000:]}")
    line = Timeline(took, sorted(at - began for at in spark.listening.values()), peak_mb=rss.peak)
    _from_log(cwd / ".sluice", began, line)
    return line


def _from_log(home: Path, began: float, line: Timeline) -> None:
    """Submission, the first split asked for and the end, from the run's log (its Redis comes
    back on the data directory for the reading)."""
    from sluice.events import OperatorEvent, RequestNextInputSplit
    from sluice.services.coordination.source import REQUEST

    with finished_run(home) as (log, job):
        job_id = job.job_id
        line.submitted = job.submitted_at / 1000 - began
        line.ended = job.ended_at / 1000 - began if job.ended_at is not None else None
        for _, env in log.replay(log.keys.inbox(log.keys.job(job_id))):
            ev = env.event
            if isinstance(ev, RequestNextInputSplit) or (
                isinstance(ev, OperatorEvent)
                and ev.to_coordinator
                and isinstance(ev.body, dict)
                and ev.body.get("type") == REQUEST
            ):
                line.first_split = env.ts / 1000 - began
                break


def run(
    *, variants: tuple[Variant, ...] = VARIANTS, runs: int = 1
) -> list[tuple[float, list[tuple[Variant, Timeline]]]]:
    """``runs`` rounds, each the plain script then every variant; each ratio is against its own
    round's plain script."""
    sys.path.insert(0, str(ROOT / "examples"))
    import wordcount  # type: ignore[import-not-found]  # examples/wordcount.py, on sys.path from the line above

    rounds = []
    with tempfile.TemporaryDirectory(prefix="sluice-bench-cold-") as tmp:
        tmp_path = Path(tmp)
        source = tmp_path / "wordcount.txt"
        wordcount.generate(source)  # the example's own input, made once for both sides
        for r in range(runs):
            round_dir = tmp_path / f"round-{r + 1}"
            round_dir.mkdir()
            with console.status(f"round {r + 1}: plain PySpark script, cold process"):
                plain_s, plain_mb = plain_process(round_dir, source)
            rows = []
            for i, variant in enumerate(variants):
                with console.status(f"round {r + 1}: sluice run, cold process ({variant.name})"):
                    rows.append((variant, sluice_process(round_dir / str(i), source, variant)))
            _print(r + 1, plain_s, plain_mb, rows)
            rounds.append((plain_s, rows))
    return rounds


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _print(round_no: int, plain_s: float, plain_mb: float, rows: list[tuple[Variant, Timeline]]) -> None:
    table = Table(
        title=f"Cold start, round {round_no}: the default example (`sluice run examples/wordcount.py`) vs a "
        f"plain PySpark script, whole processes (targets: ratio <= {RATIO_TARGET}, first split asked "
        f"for <= {FIRST_TASK_TARGET_S:.0f} s after Spark listens)"
    )
    for col in (
        "run",
        "whole s",
        "ratio",
        "Spark listens",
        "submitted",
        "1st split",
        "after listen",
        "job ended",
        "peak MB",
    ):
        table.add_column(col, justify="right")
    table.add_row("plain script, local[2]", f"{plain_s:.1f}", "1.00", "", "", "", "", "", f"{plain_mb:,.0f}")
    for variant, t in rows:
        ratio = t.whole / plain_s
        gap = t.first_task_after_listening
        table.add_row(
            f"sluice run {variant.name}",
            f"{t.whole:.1f}",
            f"{'[green]' if ratio <= RATIO_TARGET else '[red]'}{ratio:.2f}[/]",
            ", ".join(f"{x:.1f}" for x in t.listening) or "-",
            _s(t.submitted),
            _s(t.first_split),
            "-" if gap is None else f"{'[green]' if gap <= FIRST_TASK_TARGET_S else '[red]'}{gap:.1f}[/]",
            _s(t.ended),
            f"{t.peak_mb:,.0f}",
        )
    console.print(table)
    console.print(
        "Times in s from each process's start; 'after listen': from the first Spark server listening. "
        "'1st split': a source subtask's first request for a split, sent once its Spark session is "
        "connected. Peak MB: the RSS of the whole process tree (JVMs included), sampled every 0.1 s.",
        style="dim",
    )
