"""One run of the campaign across hosts: a fresh ``HostsCluster`` laid out for the seed's
fault, the chaos workload's keyed three-stage job on it, the fault once the job's tasks run,
then every check (exact output, subtasks on two hosts or more, replay equals the tables, no
stale write from a deposed leader or a lost TaskManager), a graceful stop, the leak check
on every host, and ``cluster.down()``."""

from __future__ import annotations

import shutil
import signal
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from sluice.client import Client, load_job
from sluice.events import TaskState
from sluice.services.jobs.state import TERMINAL_JOB, JobRun
from tools.hosts import Host, HostsCluster, Layout
from tools.hosts.placement import hosts_by_vertex, hosts_ran_on

from .. import checks, procs
from ..cluster import Timing, poll
from ..jobs import describe
from ..workload import JOB_FILE, expected, generate, read_output
from . import fences
from .kinds import HostKind, HostStrike, plan
from .strikes import Outcome, strike

__all__ = ["HostRunResult", "run_once", "Sizes"]

JOB_TIMEOUT_S = 300.0
ROLES = ("taskmanager", "jobmanager", "projector")


@dataclass(frozen=True)
class Sizes:
    """A run's scale: small enough that 40 runs fit in well under an hour on two cores."""

    taskmanagers: int = 2
    slots: int = 2
    vocabulary: int = 5_000
    draws: int = 15_000
    parallelism: int = 2
    reducers: int = 2
    split_bytes: int = 32 * 1024


@dataclass
class HostRunResult:
    seed: int
    planned: HostStrike
    home: Path
    outcome: Outcome | None = None
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    status: str = "-"
    restarts: int = 0
    job_s: float | None = None
    """From submission to the end seen on the log, on this process's monotonic clock."""
    hosts_used: int = 0
    took_s: float = 0.0
    exact: bool = False
    """The job FINISHED with exactly the expected output."""

    @property
    def ok(self) -> bool:
        return not self.failures


def _job(c: HostsCluster, job_id: str) -> JobRun | None:
    return Client(c.log).job(job_id, missing_ok=True)


def _tasks_running(c: HostsCluster, job_id: str) -> bool:
    job = _job(c, job_id)
    return job is not None and (
        job.status in TERMINAL_JOB
        or any(e.state == TaskState.RUNNING for v in job.vertices.values() for e in v.subtasks)
    )


def _ended(c: HostsCluster, job_id: str) -> JobRun | None:
    job = _job(c, job_id)
    return job if job is not None and job.status in TERMINAL_JOB else None


def run_once(seed: int, root: Path, *, sizes: Sizes = Sizes(), timing: Timing = Timing(), say=print) -> HostRunResult:
    home = (root / f"run-{seed}").resolve()
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    s = plan(
        seed,
        taskmanagers=sizes.taskmanagers,
        heartbeat_timeout_s=timing.heartbeat_timeout_ms / 1000,
        lease_ttl_s=timing.lease_ttl_ms / 1000,
    )
    result = HostRunResult(seed, s, home)
    started = time.monotonic()
    say(f"run {seed}: {s.describe()}")
    layout = Layout(
        taskmanagers=sizes.taskmanagers,
        slots=sizes.slots,
        timing=timing,
        proxied=(s.target,) if s.kind is HostKind.LATENCY else (),
        skew={s.target: s.offset} if s.kind is HostKind.SKEW else {},
    )
    cluster = HostsCluster(layout)
    try:
        cluster.up()
        before = {name: _tmp(h) for name, h in cluster.hosts.items()}
        _run_job(cluster, s, sizes, result)
        result.failures += [f"replay differs: {d}" for d in checks.tables_differ(cluster.log)]
        result.failures += [f"fencing: {d}" for d in checks.epochs_go_back(cluster.log)]
        result.failures += [f"fencing: {d}" for d in fences.stale_reports(cluster.log)]
        if s.kind is HostKind.SKEW:
            # A skewed clock is the run's only fault: every TaskManager stays alive, so a loss
            # means some timeout read a wall clock (issue 29: none may be declared lost).
            lost = [x.resource_id for x in fences.losses(cluster.log)]
            result.notes.append(f"TaskManagers declared lost under a skewed clock: {', '.join(lost) or 'none'}")
            result.failures += [
                f"TaskManager {tm} declared lost under a skewed clock ({s.target} {s.offset}), with nothing else wrong"
                for tm in lost
            ]
        result.failures += _stop(cluster, before)
    except Exception as exc:  # the harness or the cluster broke: the run failed, say how
        result.failures.append(f"the run stopped: {type(exc).__name__}: {exc}")
        result.notes.append(traceback.format_exc()[-1500:])
    finally:
        left = cluster.down(keep_logs=home / "logs" if result.failures else None)
        result.failures += [f"left behind after down(): {x}" for x in left]
        result.took_s = time.monotonic() - started
    o = result.outcome
    rec = f"{o.recovered_s:.1f} s" if o is not None and o.recovered_s is not None else "-"
    say(
        f"run {seed}: {'ok' if result.ok else 'FAILED'} in {result.took_s:.0f} s ({o.kind.value if o else s.kind.value} "
        f"of {o.target if o else s.target}, recovered {rec}, job {result.status} in "
        f"{result.job_s or 0:.0f} s, {result.restarts} restarts, on {result.hosts_used} hosts)"
    )
    for line in [*(o.notes if o else []), *result.notes[:1]]:
        say(f"  . {line}")
    for f in result.failures:
        say(f"  - {f}")
    return result


def _run_job(c: HostsCluster, s: HostStrike, sizes: Sizes, result: HostRunResult) -> None:
    work = generate(result.home / "input" / "input.txt", result.seed, vocabulary=sizes.vocabulary, draws=sizes.draws)
    want = expected(work.path)
    c.hosts["tm1"].put(work.path, f"{c.shared}/input")
    output = f"{c.shared}/out/job"
    job_file = load_job(
        JOB_FILE,
        {
            "input": f"{c.shared}/input/{work.path.name}",
            "output": output,
            "parallelism": str(sizes.parallelism),
            "reducers": str(sizes.reducers),
            "split_bytes": str(sizes.split_bytes),
        },
    )
    job_id = Client(c.log).submit(job_file)
    submitted = time.monotonic()
    if not poll(lambda: _tasks_running(c, job_id), 180, every=0.2):
        result.failures.append(f"no task of job {job_id} ran within 180 s")
        return
    time.sleep(s.delay_s)
    running = (j := _job(c, job_id)) is not None and j.status not in TERMINAL_JOB
    result.outcome = strike(c, s)
    if not running:
        result.notes.append("the job had ended before the fault")
    result.failures += result.outcome.failures
    job = poll(lambda: _ended(c, job_id), JOB_TIMEOUT_S, every=0.5)
    if job is None:
        result.failures.append(f"job {job_id} did not end within {JOB_TIMEOUT_S:.0f} s")
        return
    result.status, result.restarts = job.status.value, job.restarts
    result.job_s = time.monotonic() - submitted  # (not the event times: a skewed leader stamps them 30 s off)
    if job.status.value != "FINISHED":
        result.failures.append(f"job {job_id} ended {job.status.value}: {(job.reason or '')[:500]}")
        return
    got = read_output(c.hosts["tm1"].get(output, result.home / "output"))
    if got != want:
        result.failures.append(f"job {job_id}: the sink differs from the plain-Python result: {describe(got, want)}")
    else:
        result.exact = True
    # Every attempt counts: a fault that gets a host declared lost moves its subtasks, and the
    # job's last attempts may then all be on the survivor (seed 236: 30 % loss on tm2).
    used = hosts_ran_on(c.log, job_id)
    result.hosts_used = len(used)
    if len(used) < 2:
        last = {h for hosts in hosts_by_vertex(c.log, job_id).values() for h in hosts if h}
        result.failures.append(
            f"job {job_id} ran on {sorted(used)} only, not on two hosts or more (its last attempts on {sorted(last)})"
        )


def _tmp(h: Host) -> set[str]:
    """The entries of the host's private /tmp, but SeaweedFS's logs (its mount's cache is there
    from the start, the harness's, not the run's)."""
    return {n for n in h.run("ls", "-A", "/tmp", check=False).stdout.split() if not n.startswith("weed.")}


def _stop(c: HostsCluster, before: dict[str, set[str]], timeout: float = 60.0) -> list[str]:
    """Stop every Sluice process as an operator would (SIGTERM), then what is left on each host
    beyond its storage, Redis and proxy, and the files the run left in each host's /tmp (what
    was not there once the cluster was up) and in each TaskManager's temp directory."""
    sluice = [
        (h, p)
        for h in c.hosts.values()
        for p in h.pids()
        if any(r in procs.argv(p) for r in ROLES) and "faketime" not in (procs.argv(p) or [""])[0]
    ]
    for _, p in sluice:
        procs.kill(p, signal.SIGTERM)
    problems = [
        f"{h.name}: {' '.join(procs.argv(p))[:160]} outlived SIGTERM for {timeout:.0f} s"
        for h, p in sluice
        if p in procs.wait_gone([p for _, p in sluice], timeout)
    ]
    keep = ("weed", "redis-server", "tools.hosts.proxy", "sleep")
    for h in c.hosts.values():
        left = [p for p in h.pids() if not any(k in " ".join(procs.argv(p)) for k in keep)]
        if left and procs.wait_gone(left, 15):
            problems += [
                f"{h.name}: process left after its services stopped: {' '.join(procs.argv(p))[:160]}"
                for p in left
                if procs.alive(p)
            ]
        new = sorted(_tmp(h) - before.get(h.name, set()))
        tmp = h.run("find", *(f"/tmp/{n}" for n in new), "-type", "f", check=False).stdout.split() if new else []
        problems += [f"{h.name}: temp files left in its /tmp: {', '.join(tmp[:4])} ({len(tmp)} in all)"] if tmp else []
        temp = h.directory / "home" / "tmp"
        files = (
            [str(p.relative_to(temp)) for p in temp.rglob("*") if p.is_file() and not p.name.endswith(".lock")]
            if temp.is_dir()
            else []
        )
        problems += [f"{h.name}: temp files left in {temp}: {', '.join(files[:4])}"] if files else []
    return problems
