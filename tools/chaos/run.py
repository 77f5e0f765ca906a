"""One run of the chaos suite: a fresh cluster, the workload job kept running while the
seed's strikes land, then every check, then ``sluice cluster stop`` and the leak check."""

from __future__ import annotations

import shutil
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from . import checks
from .cluster import ChaosCluster, Timing, poll
from .jobs import Jobs, Submitted
from .kinds import Strike, fsync_policy, plan
from .strikes import RECOVERY_TIMEOUT_S, Outcome, strike
from .workload import Workload, expected, generate

__all__ = ["RunResult", "run_once"]

TASKMANAGERS = 2


@dataclass
class RunResult:
    seed: int
    fsync: str
    home: Path
    strikes: list[Outcome] = field(default_factory=list)
    jobs: list[Submitted] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    workload: Workload | None = None
    took_s: float = 0.0
    jobs_ok: bool = False
    """Every job FINISHED with exactly the expected output (the strikes were survived)."""

    @property
    def ok(self) -> bool:
        return not self.failures


def run_once(seed: int, kills: int, root: Path, spark: str, *, timing: Timing = Timing(), say=print) -> RunResult:
    home = (root / f"run-{seed}").resolve()
    if home.exists():
        shutil.rmtree(home)
    home.mkdir(parents=True)
    result = RunResult(seed, fsync_policy(seed), home)
    started = time.monotonic()
    strikes = plan(seed, kills)
    say(f"run {seed}: redis appendfsync {result.fsync}; strikes: " + ", ".join(s.kind.value for s in strikes))
    result.workload = generate(home / "input.txt", seed)
    want = expected(result.workload.path)
    cluster = ChaosCluster(home, f"chaos-{seed}", result.fsync, spark, timing)
    try:
        cluster.start(TASKMANAGERS)
        jobs = Jobs(cluster, result.workload.path, want, home / "output")
        result.jobs = jobs.submitted
        _strike_all(cluster, jobs, strikes, result, say)
        if not jobs.submitted:  # no strikes: the job alone
            jobs.ensure_running()
        jobs.finish_all()
        result.failures += jobs.failures
        result.jobs_ok = not jobs.failures and bool(jobs.submitted)
        result.failures += cluster.died()
        done = checks.finished_at(cluster.log)
        for o in result.strikes:
            after = [ms for ms in done if ms > o.at * 1000]
            o.progress_s = (after[0] - o.at * 1000) / 1000 if after else None
        result.failures += [f"replay differs: {d}" for d in checks.tables_differ(cluster.log)]
        result.failures += [f"fencing: {d}" for d in checks.epochs_go_back(cluster.log)]
    except Exception as exc:  # the harness or the cluster broke: the run failed, say how
        result.failures.append(f"the run stopped: {type(exc).__name__}: {exc}")
        result.notes.append(traceback.format_exc()[-1500:])
    finally:
        _teardown(cluster, result)
        result.took_s = time.monotonic() - started
    say(f"run {seed}: {'ok' if result.ok else 'FAILED'} in {result.took_s:.0f} s")
    for f in result.failures:
        say(f"  - {f}")
    return result


def _strike_all(cluster: ChaosCluster, jobs: Jobs, strikes: list[Strike], result: RunResult, say) -> None:
    for i, s in enumerate(strikes, 1):
        jobs.ensure_running()
        t_end = time.monotonic() + s.delay_s
        while time.monotonic() < t_end:
            cluster.sample_workers()
            time.sleep(0.1)
        out = strike(cluster, s)
        result.strikes.append(out)
        rec = f"{out.recovered_s:.1f} s" if out.recovered_s is not None else "no recovery"
        say(
            f"  strike {i}/{len(strikes)}: {s.kind.value} of {out.target}: {rec}"
            + (f" ({'; '.join(out.notes)})" if out.notes else "")
        )
        result.failures += out.failures
        # Back to full strength (two JobManagers, one leading; every TaskManager registered)
        # before the next strike, so that each strike meets a recovered cluster.
        if not poll(lambda: cluster.full_strength(TASKMANAGERS), RECOVERY_TIMEOUT_S, tick=cluster.sample_workers):
            result.failures.append(
                f"after {s.kind.value}: the cluster was not back to full strength within {RECOVERY_TIMEOUT_S:.0f} s"
            )
            return


def _teardown(cluster: ChaosCluster, result: RunResult) -> None:
    if not cluster.url:
        cluster.force_stop()
        return
    code, output = cluster.stop()
    if code != 0:
        result.failures.append(f"`sluice cluster stop` exited {code}: {output.strip()[-600:]}")
    left = []
    if poll(lambda: not cluster.leftovers(), 20) is None:
        left = cluster.leftovers()
    result.failures += [f"leaked process after `sluice cluster stop`: {p}" for p in left]
    cluster.force_stop()
    # A TaskManager killed with SIGKILL cleans nothing: the others of the home sweep its
    # directory once its lock is free (services/taskmanager/tempdirs.py).
    for tm, files in cluster.temp_files().items():
        result.failures.append(
            f"leaked temp files of TaskManager {tm} in {cluster.home}/tmp/{tm}: {', '.join(files[:4])}"
        )
