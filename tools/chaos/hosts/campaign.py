"""A campaign across hosts: runs with seeds S, S+1, ..., each on a cluster of its own."""

from __future__ import annotations

import io
import sys
import time
from pathlib import Path

from rich.console import Console

from tools.hosts import clean_leftovers, unavailable
from tools.hosts.net import HostsError
from tools.hosts.storage import ensure_weed

from ..cluster import Timing
from .report import summary
from .run import HostRunResult, Sizes, run_once

__all__ = ["campaign"]


def _write_summary(path: Path, results: list[HostRunResult], seed: int, runs: int, took_s: float) -> None:
    """The summary so far in ``path`` (rewritten after every run: a campaign cut short still says how far it got)."""
    out = Console(file=io.StringIO(), record=True, width=160, emoji=False, highlight=False)
    summary(out, results, seed)
    out.print(f"{len(results)} of {runs} run(s) done in {took_s:.0f} s")
    path.write_text(out.export_text())


def campaign(
    runs: int,
    seed: int,
    root: Path,
    *,
    sizes: Sizes = Sizes(),
    timing: Timing = Timing(),
    console: Console | None = None,
    summary_file: Path | None = None,
) -> list[HostRunResult]:
    console = console or Console(emoji=False, highlight=False, width=None if sys.stdout.isatty() else 160)
    ensure_weed()
    why = unavailable()
    if why:
        raise HostsError(f"hosts cannot be made here: {why}")
    clean_leftovers()
    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results: list[HostRunResult] = []
    for i in range(runs):
        results.append(run_once(seed + i, root, sizes=sizes, timing=timing, say=console.print))
        if summary_file is not None:
            _write_summary(summary_file, results, seed, runs, time.monotonic() - started)
    summary(console, results, seed)
    console.print(
        f"campaign of {runs} run(s) across hosts took {time.monotonic() - started:.0f} s; runs are kept in {root}"
    )
    return results
