"""Benchmark of failover: a JobManager's start to serving (phase "leading"), as the log grows.

The logs are written through the real store (fenced commits) on a private redis-server:
one TaskManager registered on the cluster tag, and one running job whose subtasks go
through attempt after attempt (SCHEDULED, DEPLOYING, INITIALIZING, RUNNING, FAILED, a
restart), 10^4, 10^5 and 10^6 facts. For each, a real ``JobManager`` takes over twice: with
no snapshot (a full replay) and from the snapshots the previous leader wrote. The job's log
holds what a real leader writes beside the tasks' facts: its coordinators' checkpoints
(``CoordinatorCheckpointed``, every checkpoint interval of the log's clock while facts
arrive, from the real coordinators fed every fact), so a new leader restores them and
replays a short tail, as it would. Then a
cluster holding 1,000 finished jobs and one running job (the finished ones archived out of
the replay).

Each takeover is timed twice: to serving (the leader leads: it answers TaskManagers and
clients and serves the jobs rebuilt so far; a rebuild longer than ``SERVE_AFTER_S`` goes
on while it serves) and to every live job rebuilt, beside the floor measured in the same
run: every fact stream of the log read with XRANGE and each entry ``orjson.loads``-ed (what
reading the log in Python costs at least).

Targets (issues 10 and 31): start to serving at most 1 s at 10^6 events with snapshots, and
every job rebuilt within 5 s with a full replay.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import orjson
from rich.table import Table

from sluice.events import (
    Event,
    JobRegistered,
    JobStatus,
    JobStatusChanged,
    SubmitJob,
    TaskManagerRegistered,
    TaskRestartScheduled,
    TaskState,
    UpdateTaskExecutionState,
    decode_bytes,
    decode_bytes_msgspec,
)
from sluice.services.coordination.runtime import DEFAULT_CHECKPOINT_INTERVAL_MS, JobCoordinators
from sluice.services.embedded import RedisServer
from sluice.services.jobmanager.process import SERVE_AFTER_S, JobManager, Phase
from sluice.services.jobs import core
from sluice.services.jobs.state import JobsState
from sluice.services.membership import MembershipConfig
from sluice.store import EventLog, Keys, Out, Snapshots, connect

from .console import console

__all__ = ["run"]

TM, SESSION = "tm-0", "tm-0-session"
EPOCH = 1


def _graph(name: str, parallelism: int):
    from sluice.api import Job

    j = Job(name)
    j.read_range("src", 0, parallelism * 10, per_split=10, parallelism=parallelism).write_parquet(
        "out", "/tmp/sluice-bench-recovery-out"
    )
    return j.graph()


class _Writer:
    """Facts committed through the real log, folded as they go (so they stay legal)."""

    def __init__(self, log: EventLog) -> None:
        self.log, self.keys = log, log.keys
        self.state = JobsState()
        self.ts = 1_700_000_000_000
        self.n = 0
        self.coords: dict[str, JobCoordinators] = {}
        """Per job, its coordinators as the leader runs them: fed every fact, checkpointed
        every ``DEFAULT_CHECKPOINT_INTERVAL_MS`` of the log's clock while facts arrive."""
        self.checkpoints = 0

    def commit(self, tag: str, facts: Sequence[Event], batch: int = 500) -> None:
        from sluice.events import Envelope
        from sluice.services.jobs.state import evolve

        job = self.keys.job_id_of(tag)
        stream = self.keys.facts(tag)
        for i in range(0, len(facts), batch):
            envs = []
            for f in facts[i : i + batch]:
                self.ts += 1
                self.n += 1
                env = Envelope(f, f"{self.n:032x}", EPOCH, self.ts, job)
                envs.append(env)
                if job is not None:
                    evolve(self.state, env)
            self.log.commit(tag, EPOCH, [Out(stream, e) for e in envs])
            coords = self.coords.get(job) if job is not None else None
            if coords is not None:  # what the leader's coordinators decide on these facts
                for e in envs:
                    coords.feed(e.event)
                more = coords.flush(self.ts).facts
                if more:
                    self.checkpoints += sum(type(f).__name__ == "CoordinatorCheckpointed" for f in more)
                    self.commit(tag, more, batch)

    def cluster(self, jobs: list[str]) -> None:
        self.commit(
            self.keys.cluster,
            [TaskManagerRegistered(TM, SESSION, "bench-host", 256)] + [JobRegistered(j, j) for j in jobs],
        )

    def job(self, job_id: str, parallelism: int, facts: int, *, finish: bool = False) -> None:
        """A job of ``parallelism`` subtasks and about ``facts`` facts: attempts that run and
        fail, the last ones left RUNNING (or FINISHED)."""
        graph = _graph(job_id, parallelism)
        v = graph.vertices[0].name
        d = core.decide(
            self.state,
            core.Submit(
                SubmitJob(job_id, graph, "0" * 64, "bench", "{bench:client:c}:inbox"),
                {v: []},
                "file:///tmp/sluice-bench-recovery",
            ),
            self.ts,
        )
        tag = self.keys.job(job_id)
        self.commit(tag, [*d.facts, JobStatusChanged(job_id, JobStatus.RUNNING)])
        run = self.state.jobs[job_id]
        coords = JobCoordinators(
            job_id, run.graph.vertices, run.splits, _no_user_code, interval_ms=DEFAULT_CHECKPOINT_INTERVAL_MS
        )
        coords.start(self.ts)
        self.coords[job_id] = coords
        per_cycle = 6 * parallelism
        cycles = max((facts - len(d.facts)) // per_cycle, 1)
        for cycle in range(cycles):
            last = cycle == cycles - 1
            out: list[Event] = []
            for i in range(parallelism):
                eid = f"{v}:{i}:{cycle}"
                out.append(
                    UpdateTaskExecutionState(job_id, eid, TaskState.SCHEDULED, None, v, i, cycle, TM, i, SESSION)
                )
                for s in (TaskState.DEPLOYING, TaskState.INITIALIZING, TaskState.RUNNING):
                    out.append(UpdateTaskExecutionState(job_id, eid, s, None, v, i, cycle))
                if not last:
                    out.append(
                        UpdateTaskExecutionState(job_id, eid, TaskState.FAILED, "bench: a task failure", v, i, cycle)
                    )
                    out.append(TaskRestartScheduled(job_id, v, i, cycle + 1, 0, cycle + 1))
                elif finish:
                    out.append(UpdateTaskExecutionState(job_id, eid, TaskState.FINISHED, None, v, i, cycle))
            if last and finish:
                out.append(JobStatusChanged(job_id, JobStatus.FINISHED))
            self.commit(tag, out)
        if finish:
            self.coords.pop(job_id).close()


def _no_user_code(ref: str) -> type:
    raise RuntimeError(f"the bench's jobs have no user coordinator ({ref})")


def _take_over(log: EventLog, name: str) -> tuple[float, float, JobManager]:
    """Seconds from a JobManager's start to serving (phase leading: it answers the cluster,
    and serves the jobs rebuilt so far), and to every live job rebuilt (``_cpu`` holds the
    CPU seconds this process spent on it: on a loaded machine, the part that is ours)."""
    global _cpu
    c = time.process_time()
    t = time.perf_counter()
    # No TaskManager process beats for the bench's tm-0: a leader serving while it rebuilds
    # would declare it lost (and fail the job) after the usual timeout.
    jm = JobManager(
        log,
        jm_id=name,
        lease_ttl_ms=60_000,
        max_stall_s=600,
        replay_page=2000,
        config=MembershipConfig(heartbeat_timeout_ms=3_600_000),
    )
    while jm.phase is not Phase.LEADING:
        jm.step()
        if jm.phase is Phase.STANDBY and jm.lease.epoch is None and jm.errors:
            raise RuntimeError(f"the JobManager failed: {jm.errors[-1]!r}")
    serving = time.perf_counter() - t
    while jm.replay is not None:  # the jobs left, rebuilt while it serves
        jm.step(block_ms=None)
        if not jm.leading:
            raise RuntimeError(f"the JobManager stopped leading: {jm.errors[-1:]!r}")
    took = time.perf_counter() - t
    _cpu = time.process_time() - c
    return serving, took, jm


_cpu = 0.0


def _leave(jm: JobManager, *, snapshot: bool) -> None:
    if snapshot and jm.snapshots is not None:
        jm.snapshots.next_due = 0
        jm.snapshots.tick(jm.world.now_ms())
    jm.job_inboxes.close_coordinators()
    jm.lease.release()


def _fresh(client, prefix: str) -> EventLog:
    keys = Keys(prefix)
    for k in client.scan_iter(match=keys.pattern):
        client.delete(k)
    return EventLog(client, keys)


def _floor(log: EventLog, jobs: list[str]) -> tuple[float, float]:
    """Seconds to read every fact stream of the log (the cluster's, each job's) with XRANGE
    (the store's raw reply, pages of 2,000 as the JobManager reads them) and ``orjson.loads``
    each entry: the least a replay in Python costs. The better of two reads (and its CPU seconds)."""
    best, best_cpu = float("inf"), 0.0
    for _ in range(2):
        c = time.process_time()
        t = time.perf_counter()
        for tag in [log.keys.cluster] + [log.keys.job(j) for j in jobs]:
            stream, after = log.keys.facts(tag), "0-0"
            while True:
                batch = log.backend.xrange(stream, after, 2000)
                for _, fields in batch:
                    orjson.loads(fields[b"e"])
                if len(batch) < 2000:
                    break
                after = batch[-1][0]
        took = time.perf_counter() - t
        if took < best:
            best, best_cpu = took, time.process_time() - c
    return best, best_cpu


def _decoders(log: EventLog, jobs: list[str]) -> tuple[float, float]:
    """Seconds to decode every fact of the log (read once beforehand) with the reference
    decoder (``events.decode_bytes``: orjson, then the checks in Python) and with the replay's
    (``events.decode_bytes_msgspec``: the same answers, msgspec)."""
    raws = [
        fields[b"e"]
        for tag in [log.keys.cluster] + [log.keys.job(j) for j in jobs]
        for _, fields in log.replay_raw(log.keys.facts(tag), page=2000)
    ]
    took = []
    for decode in (decode_bytes, decode_bytes_msgspec):
        for raw in raws[:100]:  # warm: each decoder compiles its event types once, when first used
            decode(raw)
        t = time.perf_counter()
        for raw in raws:
            decode(raw)
        took.append(time.perf_counter() - t)
    return took[0], took[1]


def _drop_snapshots(log: EventLog, jobs: list[str]) -> None:
    snaps = Snapshots(log)
    for tag in [log.keys.cluster] + [log.keys.job(j) for j in jobs]:
        snaps.delete(tag)


def run(
    *,
    sizes: Sequence[int] = (10_000, 100_000, 1_000_000),
    finished: int = 1000,
    redis_url: str | None = None,
    parallelism: int = 100,
) -> dict[str, tuple[float, float, float, float, float, float, tuple[float, float, float]]]:
    server = None
    if redis_url is None:
        server = RedisServer(None)
        redis_url = server.start()
    results: dict[str, tuple[float, float, float, float, float, float, tuple[float, float, float]]] = {}
    decoding: dict[str, tuple[float, float]] = {}
    facts: dict[str, int] = {}
    try:
        client = connect(redis_url)
        for n in sizes:
            log = _fresh(client, f"bench-recovery-{n}")
            w = _Writer(log)
            w.cluster(["live"])
            w.job("live", parallelism, n - 2)
            console.print(f"[dim]log of {w.n:,} facts written ({w.checkpoints:,} coordinator checkpoints)[/dim]")
            results[f"{w.n:,} events"] = _measure(log, ["live"])
            decoding[f"{w.n:,} events"] = _decoders(log, ["live"])
            facts[f"{w.n:,} events"] = w.n
        log = _fresh(client, "bench-recovery-history")
        w = _Writer(log)
        jobs = [f"done-{i:04d}" for i in range(finished)] + ["live"]
        w.cluster(jobs)
        for j in jobs[:-1]:
            w.job(j, 4, 30, finish=True)
        w.job("live", parallelism, 1000)
        console.print(f"[dim]log of {finished:,} finished jobs and a running one ({w.n:,} facts) written[/dim]")
        results[f"{finished:,} finished + 1 running job ({w.n:,} events)"] = _measure(log, jobs)
        facts[f"{finished:,} finished + 1 running job ({w.n:,} events)"] = w.n
    finally:
        if server is not None:
            server.stop()
    table = Table(
        title="JobManager start to serving (it leads; jobs not yet rebuilt are rebuilt while it serves), "
        "and to every live job rebuilt"
    )
    table.add_column("log")
    table.add_column("full replay: serving", justify="right")
    table.add_column("full replay: every job", justify="right")
    table.add_column("floor: XRANGE + orjson.loads", justify="right")
    table.add_column("every job / floor", justify="right")
    table.add_column("reference replay (orjson, no read-ahead): every job", justify="right")
    table.add_column("reference / full", justify="right")
    table.add_column("full replay per fact", justify="right")
    table.add_column("from snapshots: serving / every job", justify="right")
    for what, (full, full_all, snap, snap_all, floor, ref_all, (full_cpu, ref_cpu, floor_cpu)) in results.items():
        table.add_row(
            what,
            f"{full:.3f} s",
            f"{full_all:.3f} s (cpu {full_cpu:.2f})",
            f"{floor:.3f} s (cpu {floor_cpu:.2f})",
            f"{full_all / floor:.2f}x (cpu {full_cpu / floor_cpu:.2f}x)" if floor and floor_cpu else "-",
            f"{ref_all:.3f} s (cpu {ref_cpu:.2f})",
            f"{ref_all / full_all:.2f}x (cpu {ref_cpu / full_cpu:.2f}x)" if full_all and full_cpu else "-",
            f"{full_all / facts[what] * 1e6:.1f} µs",
            f"{snap:.3f} s / {snap_all:.3f} s",
        )
    console.print(table)
    decoders = Table(title="Decoding every fact of the log: the replay's decoder against the reference")
    decoders.add_column("log")
    decoders.add_column("orjson + checks in Python (decode_bytes)", justify="right")
    decoders.add_column("msgspec (decode_bytes_msgspec)", justify="right")
    decoders.add_column("ratio", justify="right")
    for what, (reference, fast) in decoding.items():
        decoders.add_row(what, f"{reference:.3f} s", f"{fast:.3f} s", f"{reference / fast:.2f}x" if fast else "-")
    console.print(decoders)
    console.print(
        "targets: every job rebuilt <= 5 s at 10^6 events with a full replay; serving <= 1 s from snapshots. "
        f"A leader serves once the cluster's facts are folded and it has rebuilt for {SERVE_AFTER_S:g} s "
        "(or every job is rebuilt, if sooner); a job is served once it is rebuilt."
    )
    return results


def _measure(
    log: EventLog, jobs: list[str]
) -> tuple[float, float, float, float, float, float, tuple[float, float, float]]:
    """(serving, every job rebuilt) with a full replay, the same from snapshots, the floor of
    reading the same log, every job rebuilt with the reference replay (the orjson decoder,
    no read-ahead, before them), and the CPU seconds of the full, reference and floor."""
    _drop_snapshots(log, jobs)
    reference = EventLog(log.backend, log.keys, decode=decode_bytes)  # the replay as it was:
    reference.read_ahead = False  # orjson and the checks in Python, each page read when asked
    ref, ref_all, jm = _take_over(reference, "bench-jm-reference")
    ref_cpu = _cpu
    _leave(jm, snapshot=False)
    full, full_all, jm = _take_over(log, "bench-jm-full")
    full_cpu = _cpu
    live = jm.state.jobs.jobs.get("live")
    assert jm.replay is None and live is not None and live.status == JobStatus.RUNNING, (
        f"the running job was not rebuilt as running: {live.status if live else None}"
    )
    _leave(jm, snapshot=True)  # it leaves snapshots (and archives the finished jobs)
    snap, snap_all, jm2 = _take_over(log, "bench-jm-snap")
    _leave(jm2, snapshot=False)
    floor, floor_cpu = _floor(log, jobs)
    return full, full_all, snap, snap_all, floor, ref_all, (full_cpu, ref_cpu, floor_cpu)
