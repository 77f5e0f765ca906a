"""A soak: N short jobs on one cluster (real redis-server, JobManager, TaskManager; no-op
tasks, no Spark), with Redis's memory, its key count and the leader's RSS every 100 jobs.

What it shows (issue 28's bounded storage): after the first jobs, Redis grows only by
what each job keeps (its facts, snapshot and tables, and the cluster's facts naming it),
and with ``--purge`` (each job purged once it ended) by its tombstone and the cluster's
facts alone; the transport streams stay flat; the leader's memory stays flat. The bytes a
job keeps are the slope of ``used_memory`` between the first row after the warm-up and
the last.
"""

from __future__ import annotations

import hashlib
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from sluice.api import Job
from sluice.client import Client, JobFile
from sluice.errors import SluiceError
from sluice.services.jobs.state import TERMINAL_JOB
from sluice.store import EventLog
from sluice.store.inspection import server_footprint, stream_summaries

from .cluster import NO_SPARK, BenchCluster
from .console import console
from .memory import rss_mb

__all__ = ["run", "Row", "per_job", "stream_kind"]

EVERY = 100
RETENTION_MS = 1000
"""The inboxes' and outboxes' retention in the soak: a second of traffic (the default's ten
minutes would show as growth for the first ten minutes of the run)."""


@dataclass(frozen=True)
class Row:
    jobs: int
    seconds: float
    used_memory: int
    keys: int
    sluice_keys: int
    """Of ``keys``, Sluice's (the rest are RQ's: a task's job and result live 10 minutes)."""
    sluice_bytes: int
    """What Sluice's keys take (``MEMORY USAGE``), RQ's and the server's own left out."""
    leader_rss_mb: float
    streams: dict[str, int]
    """Entries by kind of stream (inbox, subtask inbox, outbox, facts, dead letters)."""


def stream_kind(log: EventLog, stream: str) -> str:
    if ":task:" in stream and log.keys.is_inbox(stream):
        return "subtask inbox"
    return {"inbox": "inbox", "outbox": "outbox", "facts": "facts", "dead": "dead"}.get(
        stream.rsplit(":", 1)[-1], "other"
    )


def _streams(log: EventLog) -> dict[str, int]:
    out: dict[str, int] = {}
    for stream, (length, _, _) in stream_summaries(log, log.streams()).items():
        kind = stream_kind(log, stream)
        out[kind] = out.get(kind, 0) + length
    return out


def per_job(rows: list[Row], what: str = "used_memory") -> float | None:
    """Bytes a job adds (``what``: used_memory or sluice_bytes), from the first row after the
    warm-up to the last (None with fewer than two such rows)."""
    later = [r for r in rows if r.jobs >= EVERY]
    if len(later) < 2 or later[-1].jobs == later[0].jobs:
        return None
    return (getattr(later[-1], what) - getattr(later[0], what)) / (later[-1].jobs - later[0].jobs)


def _job(job_id: str, purge: bool) -> JobFile:
    j = Job(f"soak-{'purged' if purge else 'kept'}")
    j.noop("noop", parallelism=1)
    code = b"# no code: the job is a no-op vertex\n"
    return JobFile(Path("soak.py"), code, hashlib.sha256(code).hexdigest(), "sluice_bench_soak", None, j.graph(), {})


def _run_one(log: EventLog, job: JobFile, n: int, purge: bool, timeout: float = 120.0) -> None:
    client = Client(log)
    try:
        job_id = client.submit(job, job_id=f"soak-{n}")
        client.wait_accepted(job_id, timeout)
        deadline = time.monotonic() + timeout
        while (run := client.job(job_id)).status not in TERMINAL_JOB:
            if time.monotonic() > deadline:
                raise SluiceError(f"soak job {job_id} has not ended after {timeout:g} s ({run.status.value})")
            time.sleep(0.005)
        while purge:
            try:
                client.purge(job_id)
                break
            except SluiceError as exc:  # its last task may still hold its slot for a moment
                if "still hold slots" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
    finally:
        client.close()


def run(
    *, jobs: int = 1000, purge: bool = False, slots: int = 1, every: int = EVERY, streams: bool = True
) -> list[Row]:
    """Run ``jobs`` no-op jobs one after another; a row every ``every`` jobs (and at 0)."""
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="sluice-soak-") as home, BenchCluster(Path(home)) as cluster:
        log = cluster.log
        jm = cluster.spawn("jobmanager", "--inbox-retention", str(RETENTION_MS))
        tm = cluster.spawn(
            "taskmanager",
            "--resource-id",
            "tm-soak",
            "--slots",
            str(slots),
            "--spark",
            NO_SPARK,
            "--inbox-retention",
            str(RETENTION_MS),
        )
        cluster.wait_registered(1)
        time.sleep(2.0)  # the slot workers' imports
        job = _job("soak", purge)
        started = time.monotonic()

        def row(n: int) -> None:
            time.sleep(RETENTION_MS * 2.5 / 1000 if n else 0)  # the last jobs' traffic out of the window, trimmed
            used, keys, ours, ours_bytes = server_footprint(log)
            rows.append(
                Row(
                    n,
                    time.monotonic() - started,
                    used,
                    keys,
                    ours,
                    ours_bytes,
                    rss_mb(jm.pid),
                    _streams(log) if streams else {},
                )
            )
            _print_row(rows[-1], rows)

        row(0)
        for n in range(1, jobs + 1):
            _run_one(log, job, n, purge)
            for p in (jm, tm):
                if p.poll() is not None:
                    raise SluiceError(f"a process of the soak exited with code {p.returncode}; see {home}")
            if n % every == 0 or n == jobs:
                row(n)
    _summary(rows, purge)
    return rows


def _print_row(r: Row, rows: list[Row]) -> None:
    prev = rows[-2] if len(rows) > 1 else None
    grew = f" (+{(r.used_memory - prev.used_memory) / max(r.jobs - prev.jobs, 1):,.0f} B/job)" if prev else ""
    kinds = ", ".join(f"{k} {v:,}" for k, v in sorted(r.streams.items()))
    console.print(
        f"{r.jobs:>6,} jobs  {r.seconds:7.1f} s  used_memory {r.used_memory / 1e6:8.2f} MB{grew}  "
        f"keys {r.keys:>7,} (Sluice's {r.sluice_keys:,}, {r.sluice_bytes / 1e6:.2f} MB)  leader RSS {r.leader_rss_mb:6.1f} MB  entries: {kinds}",
        highlight=False,
    )


def _summary(rows: list[Row], purge: bool) -> None:
    table = Table(title=f"Soak: {rows[-1].jobs:,} no-op jobs, {'each purged once ended' if purge else 'facts kept'}")
    for col in (
        "jobs",
        "s",
        "used_memory MB",
        "keys",
        "Sluice's keys",
        "Sluice's MB",
        "leader RSS MB",
        "inbox",
        "subtask inbox",
        "outbox",
        "facts",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        s = r.streams
        table.add_row(
            f"{r.jobs:,}",
            f"{r.seconds:.0f}",
            f"{r.used_memory / 1e6:.2f}",
            f"{r.keys:,}",
            f"{r.sluice_keys:,}",
            f"{r.sluice_bytes / 1e6:.2f}",
            f"{r.leader_rss_mb:.1f}",
            *(f"{s.get(k, 0):,}" for k in ("inbox", "subtask inbox", "outbox", "facts")),
        )
    console.print(table)
    slope, ours = per_job(rows), per_job(rows, "sluice_bytes")
    later = [r for r in rows if r.jobs >= EVERY]
    if slope is not None and ours is not None:
        rss = f"{later[0].leader_rss_mb:.1f} -> {later[-1].leader_rss_mb:.1f} MB"
        console.print(
            f"after the first {EVERY} jobs, a job {'purged' if purge else 'kept'}: Redis's used_memory grows "
            f"{slope:,.0f} bytes (RQ's job and result keys, kept 10 minutes, included), Sluice's keys "
            f"{ours:,.0f} bytes; keys {later[0].keys:,} -> {later[-1].keys:,} (Sluice's "
            f"{later[0].sluice_keys:,} -> {later[-1].sluice_keys:,}); the leader's RSS {rss}"
        )
