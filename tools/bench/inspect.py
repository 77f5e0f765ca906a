"""Benchmark of looking at a long log: ``inspect stats``, ``inspect tail -n 100`` and the
dashboard's job list on a log of 10^6 events, each against the raw Redis reads that give
the same facts, measured in the same run on the same server.

    inspect stats        Sluice: `sluice inspect stats --json`, a whole process, and the
                         view it prints (sluice.views.stats), in this process
                         raw: XLEN and MEMORY USAGE of every stream, XINFO GROUPS of every
                         inbox, and XRANGE of the window's entries, in redis-py
    inspect tail -n 100  Sluice: `sluice inspect tail -n 100 --json`, a whole process, and
                         the same in this process
                         raw: XREVRANGE COUNT 100 of every stream, decoded with orjson
    dashboard job list   Sluice: GET /api/jobs of `sluice ui` (uvicorn, over HTTP)
                         raw: the projector's tables of every job, HGETALL'd
    a process            `python -c "import sluice.cli.main"` (what every command pays first)

The log: one TaskManager and 1,000 finished jobs, plus one job whose subtasks go through
attempt after attempt until the whole log holds about ``events`` facts (the recovery
benchmark's writer), projected by a real projector. Target (issue 12): at most 2 s each.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import httpx
import orjson
from rich.table import Table

from sluice.events import FIELD
from sluice.services.embedded import RedisServer
from sluice.services.projector import Projector
from sluice.store import EventLog, connect
from tools.bench.recovery import _fresh, _Writer

from .console import console

__all__ = ["run"]

TARGET_S = 2.0


def _median(fn: Callable[[], object], n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _command(url: str, prefix: str, *args: str) -> Callable[[], object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}

    def go() -> object:
        out = subprocess.run(
            [sys.executable, "-m", "sluice", "--redis", url, "--prefix", prefix, *args],
            env=env,
            capture_output=True,
            check=False,
        )
        if out.returncode != 0:
            raise RuntimeError(f"sluice {' '.join(args)} failed: {out.stderr.decode()[-500:]}")
        return out.stdout

    return go


def _raw_stats(client, log: EventLog, window_ms: int) -> Callable[[], object]:
    def go() -> object:
        streams = log.streams()
        pipe = client.pipeline(transaction=False)
        for s in streams:
            pipe.xlen(s)
            pipe.memory_usage(s)
        pipe.execute()
        for s in streams:
            if log.keys.is_inbox(s):
                client.xinfo_groups(s)
        start = f"{int(time.time() * 1000) - window_ms}-0"
        n = 0
        for s in streams:
            n += len(client.xrange(s, min=start, max="+"))
        return n

    return go


def _raw_tail(client, log: EventLog) -> Callable[[], object]:
    def go() -> object:
        out = []
        for s in log.streams():
            for _, fields in client.xrevrange(s, count=100):
                data = fields.get(FIELD)
                out.append(orjson.loads(data) if data else fields)
        return out

    return go


def _raw_jobs(client, log: EventLog, jobs: list[str]) -> Callable[[], object]:
    def go() -> object:
        pipe = client.pipeline(transaction=False)
        for j in jobs:
            pipe.hgetall(log.keys.table(log.keys.job(j), "executiongraph"))
        return pipe.execute()

    return go


def run(
    *, events: int = 1_000_000, finished: int = 1000, repeats: int = 5, redis_url: str | None = None
) -> dict[str, tuple[float, float]]:
    from sluice.ui.app import create_app
    from sluice.ui.serve import UiServer, bind
    from sluice.views.jobs import jobs as list_jobs
    from sluice.views.stats import stats

    server = None
    if redis_url is None:
        server = RedisServer(None)
        redis_url = server.start()
    rows: dict[str, tuple[float, float]] = {}
    try:
        client = connect(redis_url)
        log = _fresh(client, "bench-inspect")
        w = _Writer(log)
        names = [f"done-{i:04d}" for i in range(finished)] + ["live"]
        w.cluster(names)
        for j in names[:-1]:
            w.job(j, 4, 30, finish=True)
        w.job("live", 100, max(events - w.n, 1000))
        console.print(f"[dim]log of {w.n:,} facts written ({finished:,} finished jobs and a running one)[/dim]")
        t = time.perf_counter()
        projector = Projector(log)
        while projector.catch_up():
            pass
        console.print(f"[dim]projected in {time.perf_counter() - t:.1f} s[/dim]")
        prefix = log.keys.prefix
        process = _median(lambda: subprocess.run([sys.executable, "-c", "import sluice.cli.main"], check=True), repeats)
        rows["a process (python -c 'import sluice.cli.main')"] = (process, process)
        rows["inspect stats (whole command)"] = (
            _median(_command(redis_url, prefix, "inspect", "stats", "--json"), repeats),
            _median(_raw_stats(client, log, 60_000), repeats),
        )
        rows["inspect stats (the view, in process)"] = (
            _median(lambda: stats(log, 60), repeats),
            rows["inspect stats (whole command)"][1],
        )
        rows["inspect tail -n 100 (whole command)"] = (
            _median(_command(redis_url, prefix, "inspect", "tail", "-n", "100", "--json"), repeats),
            _median(_raw_tail(client, log), repeats),
        )
        app = create_app(log)
        ui = UiServer(app, bind("127.0.0.1", 0))
        base = ui.start()
        try:
            with httpx.Client(base_url=base, timeout=60) as http:

                def get_jobs() -> object:
                    r = http.get("/api/jobs")
                    r.raise_for_status()
                    return r.json()

                assert len(get_jobs()) == len(names)  # type: ignore[arg-type]
                rows["dashboard job list (GET /api/jobs)"] = (
                    _median(get_jobs, repeats),
                    _median(_raw_jobs(client, log, names), repeats),
                )
        finally:
            ui.stop()
        rows["job list (the view, in process)"] = (
            _median(lambda: list_jobs(log), repeats),
            rows["dashboard job list (GET /api/jobs)"][1],
        )
    finally:
        if server is not None:
            server.stop()
    table = Table(title=f"Looking at a log of {events:,} events (median of {repeats})")
    table.add_column("what")
    table.add_column("Sluice", justify="right")
    table.add_column("raw Redis", justify="right")
    table.add_column("ratio", justify="right")
    table.add_column(f"<= {TARGET_S:.0f} s", justify="center")
    for what, (ours, raw) in rows.items():
        table.add_row(
            what,
            f"{ours:.3f} s",
            f"{raw:.3f} s",
            f"{ours / raw:.1f}x" if raw else "-",
            "yes" if ours <= TARGET_S else "NO",
        )
    console.print(table)
    return rows
