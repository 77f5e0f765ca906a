"""``scripts/bench hosts``: the word count (examples/wordcount.py) across hosts of the hosts
harness (``tools.hosts``), its input and storage root on the shared SeaweedFS, in one run:

* the job on one TaskManager host (``local[*]``), and plain PySpark on that host: the same
  transformations in one ``local[*]`` session, reading the same file and writing to the
  same filesystem (``tools.bench.wordcount.plain``'s computation);
* the same job over two TaskManager hosts, each with its own ``local[*]``;
* for each Spark standalone mode asked for (``tools.hosts.spark``), the job over two hosts
  on a standalone cluster (a worker on each TaskManager host).

Each cluster runs the job once first (its slot workers make their Spark sessions, its
Spark JVMs load their classes: printed as "first"), then ``rounds`` more times, the best
counting; plain PySpark likewise runs once untimed in its session, then ``rounds`` times.
Every output is checked against a count in plain Python, word by word. Where the job's
time went comes from its own facts: per vertex, the window its tasks ran in (seconds after
SubmitJob), their RUNNING time summed, and their deployment waits (SCHEDULED to RUNNING) summed.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.table import Table

from .console import console

__all__ = ["Phase", "Row", "phases", "ratios", "table", "python_counts", "run", "MODES"]

ROOT = Path(__file__).resolve().parents[2]
MODES = ("local", "standalone", "standalone-shared")
"""Spark for the two-host rows: ``local`` always runs; the standalone ones are extra rows."""
_WORD = re.compile(r"[a-z0-9']+")


@dataclass
class Phase:
    """One vertex's share of a job run, from its facts (seconds)."""

    start: float = math.inf
    """When its first task began RUNNING, after SubmitJob."""
    end: float = 0.0
    """When its last task FINISHED, after SubmitJob."""
    running: float = 0.0
    """Its tasks' RUNNING -> FINISHED, summed."""
    waiting: float = 0.0
    """Its tasks' SCHEDULED -> RUNNING (deployment: hand-over, worker pick-up, Spark session), summed."""


@dataclass
class Row:
    name: str
    seconds: list[float]
    """Each timed round (the best counts)."""
    first: float | None = None
    """The untimed first run (a new cluster, or a new plain session)."""
    phases: dict[str, Phase] = field(default_factory=dict)
    placement: str = ""
    """Subtasks per host of the last round."""

    @property
    def best(self) -> float:
        return min(self.seconds)


def phases(submitted_ms: int, changes: Iterable[tuple[int, str, str, str]]) -> dict[str, Phase]:
    """Per vertex, its ``Phase`` from a job's task state changes ``(ts_ms, vertex, execution,
    state)`` in log order; ``submitted_ms`` is SubmitJob's time."""
    scheduled: dict[str, int] = {}
    running: dict[str, int] = {}
    out: dict[str, Phase] = {}
    for ts, vertex, execution, state in changes:
        p = out.setdefault(vertex, Phase())
        if state == "SCHEDULED":
            scheduled[execution] = ts
        elif state == "RUNNING":
            running[execution] = ts
            p.start = min(p.start, (ts - submitted_ms) / 1000)
            if execution in scheduled:
                p.waiting += (ts - scheduled[execution]) / 1000
        elif state == "FINISHED" and execution in running:
            p.running += (ts - running[execution]) / 1000
            p.end = max(p.end, (ts - submitted_ms) / 1000)
    return {v: p for v, p in out.items() if p.start != math.inf}


def ratios(rows: Sequence[Row]) -> dict[str, dict[str, float]]:
    """Per row, its best time against plain PySpark's (``plain``) and, for a two-host row,
    against the job on one host (``one host``)."""
    by_name = {r.name: r for r in rows}
    plain, one = by_name.get("plain PySpark, 1 host"), by_name.get("Sluice, 1 host")
    out: dict[str, dict[str, float]] = {}
    for r in rows:
        out[r.name] = {}
        if plain is not None:
            out[r.name]["plain"] = r.best / plain.best
        if one is not None and r.name.startswith("Sluice, 2 hosts"):
            out[r.name]["one host"] = r.best / one.best
    return out


def table(rows: Sequence[Row], title: str) -> Table:
    t = Table(title=title)
    for col in ("run", "best s", "rounds s", "first s", "/ plain", "/ 1 host", "subtasks per host"):
        t.add_column(col, justify="left" if col in ("run", "subtasks per host") else "right")
    r_of = ratios(rows)
    for r in rows:
        got = r_of[r.name]
        t.add_row(
            r.name,
            f"{r.best:.1f}",
            ", ".join(f"{s:.1f}" for s in r.seconds),
            "" if r.first is None else f"{r.first:.1f}",
            f"{got['plain']:.2f}" if "plain" in got else "",
            f"{got['one host']:.2f}" if "one host" in got else "",
            r.placement,
        )
    return t


def phase_lines(rows: Sequence[Row]) -> list[str]:
    """Where each Sluice row's best round spent its time, one line per vertex."""
    out = []
    for r in rows:
        for vertex, p in r.phases.items():
            out.append(
                f"{r.name}, {vertex}: ran {p.start:.1f}-{p.end:.1f} s after SubmitJob; tasks RUNNING "
                f"{p.running:.1f} s summed, waiting to run (SCHEDULED -> RUNNING) {p.waiting:.1f} s summed"
            )
    return out


def python_counts(path: Path) -> Counter[str]:
    """examples/wordcount.py's count in plain Python: lower-cased, split on what is not
    ``[a-z0-9']``, empty words dropped (read as Spark reads it: bad UTF-8 replaced)."""
    counts: Counter[str] = Counter()
    with path.open(encoding="utf-8", errors="replace") as f:
        while chunk := f.readlines(8 << 20):
            counts.update(_WORD.findall("".join(chunk).lower()))
    return counts


def read_counts(directory: Path) -> Counter[str]:
    """A word count's Parquet output (word, count) as a Counter (files named ``_*``/``.*`` skipped)."""
    import pyarrow.parquet as pq

    counts: Counter[str] = Counter()
    for f in sorted(directory.iterdir()):
        if f.is_file() and not f.name.startswith(("_", ".")):
            t = pq.read_table(f, columns=["word", "count"])
            for word, n in zip(t.column("word").to_pylist(), t.column("count").to_pylist()):
                counts[word] += n
    return counts


def check_counts(what: str, got: Counter[str], want: Counter[str]) -> None:
    if got != want:
        missing = sorted(set(want) - set(got))[:5]
        wrong = sorted(w for w in set(want) & set(got) if want[w] != got[w])[:5]
        raise RuntimeError(
            f"{what} is not the plain-Python count: {len(got):,} words (want {len(want):,}), "
            f"e.g. missing {missing}, different counts for {wrong}"
        )


PLAIN_SCRIPT = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, sys.argv[1])
    t = time.perf_counter()
    from pyspark.sql import SparkSession
    import wordcount
    spark = SparkSession.builder.master("local[*]").config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    session = time.perf_counter() - t
    times = []
    for i in range(int(sys.argv[4]) + 1):
        t = time.perf_counter()
        out = f"{sys.argv[3]}-{i}"
        wordcount.count(wordcount.tokenize(spark.read.text(sys.argv[2]))).write.mode("overwrite").parquet(out)
        times.append(time.perf_counter() - t)
    spark.stop()
    print(json.dumps({"session": session, "times": times}))
""")


def _plain(cluster, host_name: str, source: str, output: str, rounds: int) -> tuple[float, list[float]]:
    """Plain PySpark on ``host_name``: (its untimed first run, each timed round), seconds; its
    last output in ``output``-``rounds``."""
    from tools.bench.wordcount import cold_env

    host = cluster.hosts[host_name]
    script = cluster.directory / "plain_wordcount.py"
    script.write_text(PLAIN_SCRIPT)
    done = subprocess.run(
        [*host.enter(), sys.executable, str(script), str(ROOT / "examples"), source, output, str(rounds)],
        capture_output=True,
        text=True,
        timeout=1800,
        env=cold_env(cluster.env(host)),
    )
    if done.returncode != 0:
        raise RuntimeError(f"plain PySpark on host {host_name} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["times"][0], result["times"][1:]


def _params(source: str, output: str, parallelism: int, size: int) -> dict[str, str]:
    """The word count bench's parameters: one split a reader, as many reducers as readers, no queryable state."""
    return {
        "input": source,
        "output": output,
        "parallelism": str(parallelism),
        "reducers": str(parallelism),
        "split_bytes": str(max(size // parallelism + 1, 1 << 20)),
        "queryable": "no",
    }


def _run_job(cluster, params: dict[str, str], timeout: float = 1800.0):
    from sluice.client import Client, load_job
    from sluice.events import JobStatus
    from sluice.services.jobs.state import TERMINAL_JOB
    from tools.chaos.cluster import poll

    client = Client(cluster.log)
    job_id = client.submit(load_job(ROOT / "examples" / "wordcount.py", params))
    client.wait_accepted(job_id)

    def ended():
        job = client.job(job_id, missing_ok=True)
        return job if job is not None and job.status in TERMINAL_JOB else None

    job = poll(ended, timeout, every=0.2)
    if job is None:
        raise RuntimeError(f"job {job_id} did not end within {timeout:.0f} s; logs in {cluster.directory}")
    if job.status != JobStatus.FINISHED:
        raise RuntimeError(f"job {job_id} ended {job.status.value}: {job.reason}; logs in {cluster.directory}")
    return job


def _facts(cluster, job) -> dict[str, Phase]:
    from sluice.events import UpdateTaskExecutionState

    log = cluster.log
    changes = (
        (env.ts, env.event.vertex_id, env.event.execution_id, env.event.state.value)
        for _, env in log.replay(log.keys.facts(log.keys.job(job.job_id)))
        if isinstance(env.event, UpdateTaskExecutionState)
    )
    return phases(job.submitted_at, changes)


def _placement(cluster, job_id: str) -> str:
    from tools.hosts.placement import hosts_by_vertex

    short = {h.namespace: h.name for h in cluster.hosts.values()}
    per: Counter[str] = Counter(
        short.get(h or "", "?") for hosts in hosts_by_vertex(cluster.log, job_id).values() for h in hosts
    )
    return ", ".join(f"{h} {n}" for h, n in sorted(per.items()))


def _sluice_rows(
    name: str,
    layout,
    source: Path,
    size: int,
    parallelism: int,
    rounds: int,
    want: Counter[str],
    work: Path,
    plain_rows: list[Row] | None = None,
) -> list[Row]:
    """Bring up a cluster of ``layout``, put the input on its shared filesystem, run the job a first
    time then ``rounds`` times, check each output; with ``plain_rows``, plain PySpark runs on its first
    TaskManager host too (its row appended there). The rows, once the cluster is down."""
    from sluice.services.jobs.state import JobRun
    from tools.hosts import HostsCluster

    from .cluster import job_seconds

    cluster = HostsCluster(layout)
    with console.status(f"{name}: bringing the hosts up"):
        cluster.up()
    try:
        tm1 = cluster.hosts["tm1"]
        with console.status(f"{name}: copying the input onto the shared filesystem"):
            tm1.put(source, f"{cluster.shared}/input")
        shared_in = f"{cluster.shared}/input/{source.name}"
        out = f"{cluster.shared}/out"
        if plain_rows is not None:
            with console.status(f"plain PySpark on host tm1: a first run, then {rounds} round(s)"):
                first, times = _plain(cluster, "tm1", shared_in, f"{out}/plain", rounds)
            check_counts("plain PySpark's output", read_counts(tm1.get(f"{out}/plain-{rounds}", work / "plain")), want)
            plain_rows.append(Row("plain PySpark, 1 host", times, first, placement="tm1 (local[*])"))
        runs: list[JobRun] = []
        for i in range(rounds + 1):
            with console.status(f"{name}: {'the first run' if i == 0 else f'round {i} of {rounds}'}"):
                runs.append(_run_job(cluster, _params(shared_in, f"{out}/sluice-{i}", parallelism, size)))
            check_counts(
                f"{name}'s output (run {i})",
                read_counts(tm1.get(f"{out}/sluice-{i}", work / f"{cluster.run}-{i}")),
                want,
            )
        timed = runs[1:]
        best = min(timed, key=job_seconds)
        row = Row(
            name,
            [job_seconds(r) for r in timed],
            job_seconds(runs[0]),
            _facts(cluster, best),
            _placement(cluster, best.job_id),
        )
    finally:
        left = cluster.down()
    if left:
        raise RuntimeError(f"the hosts run {cluster.run} left things behind: {left}")
    for r in [*(plain_rows or []), row]:  # as it comes: the whole bench takes a while
        console.print(
            f"{r.name}: best {r.best:.1f} s of {', '.join(f'{s:.1f}' for s in r.seconds)}, first {r.first:.1f} s",
            style="dim",
        )
    return [row]


def run(
    *,
    megabytes: int = 60,
    corpus: str = "source",
    parallelism: int = 2,
    rounds: int = 2,
    modes: Sequence[str] = ("local", "standalone"),
) -> list[Row]:
    """The rows (plain PySpark, Sluice on one host, on two hosts per Spark mode), printed as a table."""
    import os

    from tools.hosts import Layout, unavailable

    from .corpus import write_corpus

    why = unavailable()
    if why:
        raise RuntimeError(f"hosts cannot be made here: {why}")
    bad = [m for m in modes if m not in MODES]
    if bad or "local" not in modes:
        raise ValueError(f"Spark modes {list(modes)}: each must be one of {', '.join(MODES)}, local among them")
    rows: list[Row] = []
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="sluice-bench-hosts-") as tmp:
        work = Path(tmp)
        source = work / "input.txt"
        with console.status(f"writing {megabytes} MB of the {corpus} corpus and counting it in plain Python"):
            write_corpus(corpus, source, megabytes)
            want = python_counts(source)
        size = source.stat().st_size
        t0 = time.monotonic()
        one = Layout(taskmanagers=1, slots=parallelism)
        two = math.ceil(parallelism / 2)
        plain_rows: list[Row] = []
        sluice_one = _sluice_rows("Sluice, 1 host", one, source, size, parallelism, rounds, want, work, plain_rows)
        rows += plain_rows + sluice_one
        for mode in modes:
            rows += _sluice_rows(
                f"Sluice, 2 hosts, {mode}",
                Layout(taskmanagers=2, slots=two, spark=mode),
                source,
                size,
                parallelism,
                rounds,
                want,
                work,
            )
        took = time.monotonic() - t0
    console.print(
        table(
            rows,
            f"Word count across hosts: {size / 1e6:.0f} MB of the {corpus} corpus "
            f"({len(want):,} distinct words), parallelism {parallelism}, storage and input on "
            "SeaweedFS",
        )
    )
    console.print(
        f"job: SubmitJob -> FINISHED by the log's clock; plain: read + count + write in one warm local[*] "
        f"session on host tm1. Best of {rounds} round(s) after an untimed first run each (first s). "
        f"2 hosts: {two} slot(s) a host; 1 host: {parallelism} slots. Every output equals the plain-Python "
        f"count. Load average at the start {load[0]:.1f} ({os.cpu_count()} cores), at the end "
        f"{os.getloadavg()[0]:.1f}; the whole run {took:.0f} s.",
        style="dim",
    )
    for line in phase_lines(rows):
        console.print("  " + line, style="dim")
    return rows
