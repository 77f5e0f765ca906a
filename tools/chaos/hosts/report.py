"""The campaign's summary across hosts: one row per run, then per kind of fault the runs,
those that passed every check, and the time to recover; the failures with their replay command."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from ..report import _fmt, print_failed
from .kinds import KINDS
from .run import HostRunResult

__all__ = ["summary", "totals"]


def totals(results: Sequence[HostRunResult]) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for kind in KINDS:
        mine = [r for r in results if r.planned.kind is kind]
        out[kind.value] = {
            "runs": len(mine),
            "ok": sum(1 for r in mine if r.ok),
            "exact": sum(1 for r in mine if r.exact),
            "recovery_s": [r.outcome.recovered_s for r in mine if r.outcome and r.outcome.recovered_s is not None],
            "job_s": [r.job_s for r in mine if r.job_s is not None],
        }
    return out


def summary(console: Console, results: Sequence[HostRunResult], seed: int) -> None:
    runs = Table(title=f"chaos runs across hosts (seeds {seed}..{seed + len(results) - 1})")
    for col in ("run seed", "fault", "recovered", "job", "restarts", "hosts", "took", "result"):
        runs.add_column(col, overflow="fold")
    for r in results:
        o = r.outcome
        rec = f"{o.recovered_s:.1f} s" if o and o.recovered_s is not None else "-"
        fault = r.planned.describe() if o is None else r.planned.describe().replace(r.planned.target, o.target, 1)
        result = "[green]ok[/]" if r.ok else f"[red]FAILED ({len(r.failures)})[/]"
        runs.add_row(
            str(r.seed),
            fault,
            rec,
            f"{r.status} {r.job_s or 0:.0f} s",
            str(r.restarts),
            str(r.hosts_used),
            f"{r.took_s:.0f} s",
            result,
        )
    console.print(runs)
    kinds = Table(
        title="runs by kind (ok: every check passed; exact: the job FINISHED with the plain-Python output; "
        "recovery: from the heal to the struck TaskManager registered afresh or the cluster at full "
        "strength, for a cut leader from the cut to the standby leading)"
    )
    for col in ("kind", "runs", "ok", "exact", "recovery median s", "max s", "min s", "job median s", "max s"):
        kinds.add_column(col)
    n = ok = exact = 0
    for kind, t in totals(results).items():
        times, jobs = t["recovery_s"], t["job_s"]
        assert isinstance(times, list) and isinstance(jobs, list)
        n, ok, exact = n + int(str(t["runs"])), ok + int(str(t["ok"])), exact + int(str(t["exact"]))
        kinds.add_row(kind, str(t["runs"]), str(t["ok"]), str(t["exact"]), *_fmt(times), *_fmt(jobs)[:2])
    kinds.add_row("[b]all[/]", f"[b]{n}[/]", f"[b]{ok}[/]", f"[b]{exact}[/]", "", "", "", "", "")
    console.print(kinds)
    failed = [r for r in results if not r.ok]
    if not failed:
        console.print(
            f"[green]{len(results)} runs: every job's output exact, replay equals the tables, no stale "
            "write, nothing leaked on any host[/]"
        )
        return
    print_failed(console, failed, lambda seed: f"scripts/chaos --hosts --runs 1 --seed {seed}")
