"""A campaign: runs with seeds S, S+1, ... on one shared Spark Connect server."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from rich.console import Console

from sluice.services.embedded.spark_connect import SparkConnectServer

from . import procs
from .cluster import Timing
from .report import summary
from .run import RunResult, run_once

__all__ = ["campaign"]


def campaign(
    runs: int, seed: int, kills: int, root: Path, *, timing: Timing = Timing(), console: Console | None = None
) -> list[RunResult]:
    console = console or Console(emoji=False, highlight=False, width=None if sys.stdout.isatty() else 160)
    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    # One Spark Connect server for every run (a JVM takes long to start); the runs'
    # TaskManagers use it and start none of their own. It is stopped, and checked gone, last.
    spark = SparkConnectServer(log_file=root / "spark-connect.log")
    with console.status("starting Spark Connect"):
        url = spark.start(wait=True, detach=True)
    spark_pids = [p for p in [spark.pid] if p] + procs.descendants(spark.pid or 0)
    results: list[RunResult] = []
    try:
        for i in range(runs):
            results.append(run_once(seed + i, kills, root, url, timing=timing, say=console.print))
    finally:
        spark.stop()
        left = procs.wait_gone(spark_pids + procs.descendants(spark_pids[0]) if spark_pids else [], 20)
        if left and results:
            results[-1].failures += [f"leaked Spark Connect process {p}: {' '.join(procs.argv(p))[:120]}" for p in left]
        for p in left:
            procs.kill(p)
    summary(console, results, seed, kills)
    console.print(f"campaign of {runs} run(s) took {time.monotonic() - started:.0f} s; runs are kept in {root}")
    return results
