"""The campaign's summary: strikes of each kind, survived, time to recover; one row per run."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from rich.console import Console
from rich.table import Table

from .kinds import KINDS
from .run import RunResult

__all__ = ["summary", "totals", "print_failed"]


def totals(results: Sequence[RunResult]) -> dict[str, dict[str, object]]:
    """Per kind: strikes, survived (the cluster recovered and every job of the run FINISHED with
    exact output; the run's other checks are reported per run), recovery times."""
    out: dict[str, dict[str, object]] = {}
    for kind in KINDS:
        mine = [(r, o) for r in results for o in r.strikes if o.kind is kind]
        times = [o.recovered_s for _, o in mine if o.recovered_s is not None]
        out[kind.value] = {
            "strikes": len(mine),
            "survived": sum(1 for r, o in mine if r.jobs_ok and o.recovered_s is not None and not o.failures),
            "recovery_s": times,
            "progress_s": [o.progress_s for _, o in mine if o.progress_s is not None],
        }
    return out


def _fmt(times: list[float]) -> tuple[str, str, str]:
    if not times:
        return "-", "-", "-"
    return f"{statistics.median(times):.1f}", f"{max(times):.1f}", f"{min(times):.1f}"


def summary(console: Console, results: Sequence[RunResult], seed: int, kills: int) -> None:
    runs = Table(title=f"chaos runs (seed {seed}, {kills} strikes per run)")
    for col in ("run seed", "fsync", "strikes", "jobs", "restarts", "took", "result"):
        runs.add_column(col, overflow="fold")
    for r in results:
        strikes = ", ".join(
            f"{o.kind.value} {o.recovered_s:.1f}s" if o.recovered_s is not None else f"{o.kind.value} -"
            for o in r.strikes
        )
        jobs = ", ".join(j.status for j in r.jobs) or "-"
        restarts = ", ".join(str(j.restarts) for j in r.jobs) or "-"
        result = "[green]ok[/]" if r.ok else f"[red]FAILED ({len(r.failures)})[/]"
        runs.add_row(str(r.seed), r.fsync, strikes, jobs, restarts, f"{r.took_s:.0f} s", result)
    console.print(runs)

    kinds = Table(
        title="strikes by kind (recovery: kill -> next leader leading / TaskManager registered / "
        "worker replaced / leader rebuilt on the restarted Redis; freezes: from SIGCONT for a "
        "TaskManager, from SIGSTOP for the leader; next task FINISHED: from the strike to the next task of any job finishing (a task lasts tens of seconds))"
    )
    for col in (
        "kind",
        "strikes",
        "survived",
        "recovery median s",
        "max s",
        "min s",
        "next task FINISHED median s",
        "max s",
    ):
        kinds.add_column(col)
    all_times: list[float] = []
    all_progress: list[float] = []
    survived = 0
    for kind, t in totals(results).items():
        times, progress = t["recovery_s"], t["progress_s"]
        assert isinstance(times, list) and isinstance(progress, list)
        all_times += times
        all_progress += progress
        survived += int(str(t["survived"]))
        kinds.add_row(kind, str(t["strikes"]), str(t["survived"]), *_fmt(times), *_fmt(progress)[:2])
    n = sum(len(r.strikes) for r in results)
    kinds.add_row("[b]all[/]", f"[b]{n}[/]", f"[b]{survived}[/]", *_fmt(all_times), *_fmt(all_progress)[:2])
    console.print(kinds)
    fsyncs = {
        f: sum(1 for r in results for o in r.strikes if r.fsync == f and o.kind.value == "redis-restart")
        for f in ("always", "everysec")
    }
    console.print(f"redis restarts under appendfsync always: {fsyncs['always']}, everysec: {fsyncs['everysec']}")
    for r in results:
        for note in r.notes:
            console.print(f"run {r.seed}: {note}", soft_wrap=True, markup=False, style="dim")
    failed = [r for r in results if not r.ok]
    if not failed:
        console.print(
            f"[green]{len(results)} runs, {n} strikes: every job's output exact, replay equals the "
            "tables, no stale write, nothing leaked[/]"
        )
        return
    print_failed(console, failed, lambda seed: f"scripts/chaos --runs 1 --seed {seed} --kills {kills}")


class Failed(Protocol):
    seed: int
    home: Path
    failures: list[str]


def print_failed(console: Console, failed: Sequence[Failed], replay: Callable[[int], str]) -> None:
    """Each failed run: where its logs are, its failures, the command that replays it."""
    for r in failed:
        console.print(f"[red]run {r.seed} FAILED[/] (logs in {r.home}/logs):", soft_wrap=True)
        for f in r.failures:
            console.print(f"  - {f}", soft_wrap=True, markup=False)
        console.print(f"  replay it: {replay(r.seed)}", soft_wrap=True, markup=False)
