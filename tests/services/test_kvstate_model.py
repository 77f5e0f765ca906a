"""The KvState registry as a state machine: the jobs machine (test_jobs_model.py), with jobs
that publish queryable state, and TaskManagers that register it, late, twice, from stale
attempts, under names other vertices hold, and unregister it (known names, unknown names,
wrong vertices, bad ranges).

Each notification's outcome is predicted from the registry's rules (services/kvstate/core.py)
and checked: a registration from the subtask's current live attempt is taken (the first of
a name creates its location; a later one of the same vertex replaces its range); one from
a stale attempt, an unknown vertex or with a range outside the key groups is refused and
changes nothing; one of a name another vertex holds is a clash that fails the registering
vertex without restart (so the job fails); a registration sent twice by the same attempt
changes nothing the second time; unregistering an unknown name, or from the wrong vertex,
is an error that changes nothing.

And after every decision: ranges never overlap and stay inside the key groups; every entry
belongs to its subtask's current attempt while it runs or after it finished (a failed or
cancelled attempt's state is unregistered in the decision that records the end, before
its restart); state ids the leader retires (and deletes) are served by no range; a failed
or cancelled job has no locations; the registry folded alone, as the projector does, and
the whole state replayed, equal the live ones.
"""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

from sluice.events import (
    DisposeJob,
    Envelope,
    Event,
    JobDisposed,
    JobEdge,
    JobGraph,
    JobRefused,
    JobStatus,
    JobVertex,
    KeyGroupRange,
    KvStateNotificationRefused,
    NotifyKvStateRegistered,
    NotifyKvStateUnregistered,
    RestartStrategy,
    ScheduleOrUpdateConsumers,
    SinkSpec,
    SourceSpec,
    SubmitJob,
    SubmitTask,
    TaskRestartScheduled,
    TaskState,
    UpdateTaskExecutionState,
)
from sluice.services.dataplane.keygroups import key_group_range
from sluice.services.jobs import core
from sluice.services.jobs.machine import LIVE_JOB, LIVE_TASK
from sluice.services.jobs.state import TERMINAL_JOB, Execution, JobRun, JobsState, evolve, parse_execution_id
from sluice.services.kvstate import core as kvcore
from sluice.services.kvstate import registry as kvreg
from tests.services.test_jobs_model import CFG, EXAMPLES, FN, LIVE, TMS, JobsMachine, graphs, normalize_job, pick

ADDR = "redis://127.0.0.1:6379/0"
KEPT = LIVE | {TaskState.FINISHED}
"""An attempt's registrations stay while it runs (or is being cancelled) and after it finished."""


KV_RESTARTS = st.sampled_from(
    [
        RestartStrategy("none"),
        RestartStrategy("fixed-delay", 5, 0),
        RestartStrategy("fixed-delay", 5, 100),
        RestartStrategy("exponential-backoff", 5, 50, 300),
    ]
)
"""Mostly jobs that outlive a few failures, so their attempts get to register (and stale ones to try)."""


def rows(job: JobRun) -> dict:
    return {n: kvreg.location_row(loc) for n, loc in sorted(job.kvstate.locations.items())}


def names(job: JobRun) -> list[str]:
    """Every registration name the job declares or holds, sorted."""
    declared = {v.spec.queryable for v in job.vertices.values() if v.spec.queryable}
    return sorted(declared | set(job.kvstate.locations))


def registration(task: SubmitTask, name: str, rng: tuple[int, int], eid: str | None = "") -> NotifyKvStateRegistered:
    eid = task.execution_id if eid == "" else eid
    return NotifyKvStateRegistered(
        task.job_id, task.vertex_id, KeyGroupRange(*rng), name, f"sid-{name}-{task.execution_id}", ADDR, eid
    )


def publication(job: JobRun, ex: Execution, name: str) -> NotifyKvStateRegistered:
    """What ``ex``'s worker registers: its key groups' state under ``name``."""
    r = key_group_range(job.graph.max_parallelism, len(job.vertices[ex.vertex].subtasks), ex.subtask)
    return NotifyKvStateRegistered(job.job_id, ex.vertex, KeyGroupRange(*r), name, f"sid-{name}-{ex.id}", ADDR, ex.id)


def expected(job: JobRun, msg: NotifyKvStateRegistered | NotifyKvStateUnregistered) -> str:
    """The registry's rules, as the outcome they predict for ``msg``."""
    if job.status not in LIVE_JOB:
        return "job not found"
    r = msg.key_group_range
    if not 0 <= r.start <= r.end < job.graph.max_parallelism:
        return "is outside"
    loc = job.kvstate.locations.get(msg.registration_name)
    if isinstance(msg, NotifyKvStateUnregistered):
        if loc is None:
            return "unknown registration name"
        return "cannot unregister" if loc.vertex != msg.vertex_id else "taken"
    if msg.vertex_id not in job.vertices:
        return "unknown job vertex"
    if msg.execution_id is not None:
        try:
            v, s, a = parse_execution_id(msg.execution_id)
        except ValueError:
            return "is stale"
        subtasks = job.vertices[v].subtasks if v in job.vertices else []
        if (
            v != msg.vertex_id
            or not 0 <= s < len(subtasks)
            or subtasks[s].attempt != a
            or subtasks[s].state not in LIVE_TASK
        ):
            return "is stale"
    if loc is not None and loc.vertex != msg.vertex_id:
        return "registration name clash"
    return "taken"


class KvStateMachine(JobsMachine):
    """The jobs machine, with queryable state published, refused, released and disposed."""

    def __init__(self) -> None:
        super().__init__()
        self.projected: dict[str, kvreg.KvStateRegistry] = {}
        self.last_registration: NotifyKvStateRegistered | None = None
        self.published: set[str] = set()

    # --- jobs that publish queryable state ---

    @initialize(
        slots=st.lists(st.integers(1, 3), min_size=1, max_size=len(TMS)),
        graph=graphs(queryable=True, restarts=KV_RESTARTS),
        warmup=st.integers(0, 6),
    )
    def cluster_starts(self, slots: list[int], graph: JobGraph, warmup: int) -> None:
        """As in the jobs model, with a job that publishes queryable state."""
        JobsMachine.cluster_starts(self, slots, graph, warmup)

    @precondition(lambda self: len(self.job_ids) < 3)
    @rule(graph=graphs(queryable=True, restarts=KV_RESTARTS))
    def submit(self, graph: JobGraph) -> None:
        JobsMachine.submit(self, graph)

    # --- notifications ---

    def step(self, job: JobRun, ex: Execution, variant: bool) -> None:
        """A running attempt of a queryable vertex registers its state before it finishes
        (services/kvstate/publish.py), as its worker does."""
        name = job.vertices[ex.vertex].spec.queryable
        ready = not job.vertices[ex.vertex].outputs or ex.produced
        if name and ex.state == TaskState.RUNNING and ready and ex.id not in self.published:
            self.published.add(ex.id)
            self.notify(publication(job, ex, name))
        else:
            super().step(job, ex, variant)

    def clashes(self) -> list[tuple[JobRun, Execution, str]]:
        return [
            (job, ex, name)
            for job, ex in self.live_tasks()
            if job.status in LIVE_JOB and ex.state in LIVE_TASK
            for name, loc in sorted(job.kvstate.locations.items())
            if loc.vertex != ex.vertex
        ]

    @precondition(lambda self: self.clashes())
    @rule(i=st.integers(0, 30))
    def clash(self, i: int) -> None:
        """A live attempt registers a name another vertex holds."""
        job, ex, name = pick(self.clashes(), i)
        self.notify(publication(job, ex, name))

    def notify(self, msg: NotifyKvStateRegistered | NotifyKvStateUnregistered) -> core.Decision:
        """Tell the job's inbox ``msg`` and check the outcome the registry's rules predict."""
        job = self.state.jobs[msg.job_id]
        outcome = expected(job, msg)
        before, status, restarts = rows(job), job.status, job.restarts
        d = self.tell(job.job_id, msg, remember=False)
        if outcome == "taken":
            assert d.note is None and len(d.facts) == 1 and type(d.facts[0]) is type(msg), (msg, d.facts, d.note)
            assert (job.status, job.restarts) == (status, restarts)
            r = msg.key_group_range
            if isinstance(msg, NotifyKvStateRegistered):
                loc = job.kvstate.locations[msg.registration_name]
                assert loc.entries[(r.start, r.end)] == kvreg.KvStateEntry(
                    r.start, r.end, msg.state_id, ADDR, msg.execution_id
                )
                assert all(
                    e.start > r.end or e.end < r.start or (e.start, e.end) == (r.start, r.end)
                    for e in loc.entries.values()
                ), f"{msg} left another range over its key groups"
            else:
                loc = job.kvstate.locations.get(msg.registration_name)
                assert loc is None or all(e.start > r.end or e.end < r.start for e in loc.entries.values()), (
                    f"{msg} was taken, and its key groups are still registered"
                )
                was = {(e["start"], e["end"]): e["state_id"] for e in before[msg.registration_name]["ranges"]}
                hit = {sid for (a, b), sid in was.items() if a <= r.end and b >= r.start}
                kept = {e.state_id for e in loc.entries.values()} if loc is not None else set()
                assert sorted(d.facts[0].state_ids) == sorted(hit - kept), f"{msg} retired {d.facts[0].state_ids}"
        elif outcome == "registration name clash":
            refused = d.facts[0]
            assert isinstance(refused, KvStateNotificationRefused) and outcome in refused.reason
            holder = before[msg.registration_name]["vertex"]
            assert repr(msg.vertex_id) in d.note and repr(holder) in d.note, d.note
            assert job.status in (JobStatus.FAILING, JobStatus.FAILED), f"a clash left {job.job_id} {job.status.value}"
            assert job.restarts == restarts and not any(isinstance(f, TaskRestartScheduled) for f in d.facts), (
                "a clash restarted something"
            )
            assert "(no restart)" in job.reason, job.reason
            if job.status != JobStatus.FAILED:  # the holder's registrations stay until the job has failed
                assert {n: r for n, r in rows(job).items() if n == msg.registration_name} == {
                    msg.registration_name: before[msg.registration_name]
                }
        else:
            assert [type(f) for f in d.facts] == [KvStateNotificationRefused], (msg, outcome, d.facts)
            assert outcome in d.note and outcome in d.facts[0].reason, (outcome, d.note)
            assert rows(job) == before and (job.status, job.restarts) == (status, restarts)
        return d

    @precondition(lambda self: self.tasks)
    @rule(i=st.integers(0, 30), n=st.integers(0, 4), rng=st.sampled_from(["own", "part", "bad"]), twice=st.booleans())
    def task_registers(self, i: int, n: int, rng: str, twice: bool) -> None:
        """An attempt ever deployed (current or stale) registers state for its key groups (or a
        part, or a range outside them) under its own name or another; maybe twice in a row
        (the worker could not tell the first arrived)."""
        task = pick(self.tasks, -1 - i)
        job = self.state.jobs[task.job_id]
        own = task.descriptor.queryable.name if task.descriptor.queryable else None
        name = own if own is not None and n == 0 else pick(names(job), n)
        start, end = key_group_range(job.graph.max_parallelism, task.descriptor.parallelism, task.subtask)
        r = {"own": (start, end), "part": (start, (start + end) // 2), "bad": (start, job.graph.max_parallelism)}[rng]
        msg = registration(task, name, r)
        self.notify(msg)
        self.last_registration = msg
        if twice:
            before, status = rows(job), job.status
            self.notify(msg)
            assert rows(job) == before and job.status == status, "a registration sent twice changed the registry"

    @precondition(lambda self: self.last_registration is not None)
    @rule()
    def registration_again(self) -> None:
        """The last registration, delivered again later."""
        self.notify(self.last_registration)

    @precondition(lambda self: self.job_ids)
    @rule(
        i=st.integers(0, 9),
        n=st.integers(0, 4),
        vertex=st.integers(0, 4),
        j=st.integers(0, 30),
        rng=st.sampled_from(["task", "all", "bad"]),
    )
    def unregistration(self, i: int, n: int, vertex: int, j: int, rng: str) -> None:
        """An unregistration: of a name held or not, by its vertex or another, for the range of
        an attempt ever deployed (current or stale), every key group, or a range outside them."""
        job = self.state.jobs[pick(self.job_ids, i)]
        name = pick(names(job) + ["nope"], n)
        loc = job.kvstate.locations.get(name)
        vertices = sorted(job.vertices)
        v = loc.vertex if loc is not None and vertex == 0 else pick(vertices, vertex)
        maxp = job.graph.max_parallelism
        tasks = [t for t in self.tasks if t.job_id == job.job_id and t.vertex_id == v]
        if rng == "task" and tasks:
            task = pick(tasks, -1 - j)
            r = key_group_range(maxp, task.descriptor.parallelism, task.subtask)
        else:
            r = (0, maxp - 1) if rng != "bad" else (0, maxp)
        self.notify(NotifyKvStateUnregistered(job.job_id, v, KeyGroupRange(*r), name))

    @precondition(lambda self: self.tasks)
    @rule(i=st.integers(0, 30), kind=st.integers(0, 5))
    def hostile_registration(self, i: int, kind: int) -> None:
        """A registration naming no attempt of its vertex (a ghost vertex, a garbage execution
        id, another vertex's attempt, a negative subtask), or no attempt at all (Flink's message
        has none; then nothing can be checked against the attempt, and nothing releases it
        but the job's end), under its own state id or an attempt's."""
        task = pick(self.tasks, -1 - i)
        job = self.state.jobs[task.job_id]
        name = pick(names(job), i)
        r = key_group_range(job.graph.max_parallelism, task.descriptor.parallelism, task.subtask)
        v = task.vertex_id
        other = next((w for w in sorted(job.vertices) if w != v), None)
        msg = [
            NotifyKvStateRegistered(job.job_id, "ghost", KeyGroupRange(*r), name, "sid-x", ADDR, task.execution_id),
            registration(task, name, r, eid="garbage"),
            registration(task, name, r, eid=job.vertices[other].subtasks[0].id) if other else None,
            registration(task, name, r, eid=f"{v}:-1:{job.vertices[v].subtasks[-1].attempt}"),
            dataclasses.replace(registration(task, name, r, eid=None), state_id=f"sid-{name}-no-attempt"),
            registration(task, name, r, eid=None),
        ][kind]
        if msg is None or kind in HOSTILE_REGISTRATION_BUGS:
            return
        self.notify(msg)

    @precondition(lambda self: self.job_ids)
    @rule(i=st.integers(0, 9))
    def dispose(self, i: int) -> None:
        """A client asks to dispose a job's queryable state: refused while the job runs; once it
        ended, every name and state id it held is released and its state deleted."""
        job = self.state.jobs[pick(self.job_ids, i)]
        ids, held = sorted(job.kvstate.state_ids), sorted(job.kvstate.locations)
        facts, reply = kvcore.dispose(self.state, DisposeJob(job.job_id, "client-x"))
        if job.status not in TERMINAL_JOB:
            assert facts == [] and isinstance(reply, JobRefused) and "cancel it first" in reply.reason
            return
        assert facts == [reply] == [JobDisposed(job.job_id, held, ids)]
        d = core.Decision(list(facts), job_id=job.job_id, now=self.now)
        for fact in facts:
            evolve(self.state, Envelope(fact, "", 0, self.now))
        self.record(d)
        assert job.kvstate.locations == {} and job.kvstate.disposed
        self.frozen[job.job_id] = normalize_job(job)

    # --- checks on every fact and every decision ---

    def folded(self, fact: Event) -> None:
        if type(fact) in kvreg.FACTS:
            kvreg.evolve(self.projected.setdefault(fact.job_id, kvreg.KvStateRegistry()), fact)
        if isinstance(fact, TaskRestartScheduled):  # the ended attempt's state went before its restart
            job = self.replayed.jobs[fact.job_id]
            for name, loc in job.kvstate.locations.items():
                for e in loc.entries.values():
                    if e.execution_id is not None:
                        v, s, a = parse_execution_id(e.execution_id)
                        assert (v, s) != (fact.vertex_id, fact.subtask) or a >= fact.attempt, (
                            f"{fact.vertex_id}[{fact.subtask}] restarts as attempt {fact.attempt} while {name!r} "
                            f"still points to {e.execution_id}'s state"
                        )

    def committed(self, d: core.Decision) -> None:
        job = self.replayed.jobs.get(d.job_id)
        if job is None:
            return
        check_registry(job)
        retired = {sid for f in d.facts if isinstance(f, NotifyKvStateUnregistered) for sid in f.state_ids}
        served = {e.state_id for loc in job.kvstate.locations.values() for e in loc.entries.values()}
        assert not retired & served, f"{sorted(retired & served)} are deleted and still served"
        for f in d.facts:
            if isinstance(f, UpdateTaskExecutionState) and f.state in (TaskState.FAILED, TaskState.CANCELED):
                assert not any(
                    e.execution_id == f.execution_id
                    for loc in job.kvstate.locations.values()
                    for e in loc.entries.values()
                ), f"{f.execution_id} ended and its state stays"

    @rule()
    def check_the_projection(self) -> None:
        """The KvStateLocation table (the registry's evolve alone, as the projector folds it)."""
        for jid, job in self.state.jobs.items():
            projected = self.projected.get(jid, kvreg.KvStateRegistry())
            assert {n: kvreg.location_row(loc) for n, loc in sorted(projected.locations.items())} == rows(job)
            check_registry(job)

    def teardown(self) -> None:
        super().teardown()
        self.check_the_projection()


def check_registry(job: JobRun) -> None:
    maxp = job.graph.max_parallelism
    if job.status in (JobStatus.FAILED, JobStatus.CANCELED):
        assert not job.kvstate.locations, f"{job.job_id} is {job.status.value} and still serves state"
    for name, loc in job.kvstate.locations.items():
        assert loc.entries and loc.vertex in job.vertices, f"{name!r}: {loc}"
        ranges = sorted(loc.entries)
        for (_, b), (c, _) in zip(ranges, ranges[1:]):
            assert b < c, f"{name!r} has overlapping ranges {ranges}"
        for (a, b), e in loc.entries.items():
            assert (a, b) == (e.start, e.end) and 0 <= a <= b < maxp, f"{name!r}: {e}"
            if e.execution_id is None:
                continue
            v, s, att = parse_execution_id(e.execution_id)
            subtasks = job.vertices[loc.vertex].subtasks
            assert v == loc.vertex and 0 <= s < len(subtasks), f"{name!r} points to {e.execution_id}, no attempt"
            ex = subtasks[s]
            assert ex.attempt == att and ex.state in KEPT, (
                f"{name!r} points to {e.execution_id}, but {ex.id} is {ex.state.value}"
            )


HOSTILE_REGISTRATION_BUGS: frozenset[int] = frozenset()
"""Hostile registrations (``hostile_registration`` kinds) services/ would still take: the
machine skips them. Empty since the bugs the regression tests below pin were fixed (an
execution id with a negative subtask); add a kind with its test."""

TestKvStateModel = KvStateMachine.TestCase
TestKvStateModel.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


# --- what the machine found: regression tests ----------------------------------------------------


def keyed_job_running() -> tuple[JobsState, JobRun]:
    """s0 (parallelism 2, finished) feeds c0 (parallelism 2, queryable 'q0') by key; both c0
    attempts run."""
    src = JobVertex("s0", "source", 2, source=SourceSpec("text", ["/x"], 100))
    c0 = JobVertex("c0", "transform", 2, [FN], sink=SinkSpec("parquet", "/out"), queryable="q0")
    graph = JobGraph("g", [src, c0], [JobEdge("s0", "c0", "keyed", "k")], 128, RestartStrategy("fixed-delay", 3, 0))
    state = JobsState()
    core.decide(state, core.Submit(SubmitJob("j1", graph, "blob", "mod", "client-j1"), {"s0": []}, "file:///s"), 1_000)

    def tell(msg: Event) -> core.Decision:
        return core.decide(state, core.Inbound("j1", Envelope(msg, "m"), CFG), 1_000)

    core.decide(state, core.Schedule("j1", {"tm-a": [0, 1, 2, 3]}), 1_000)
    for s in (0, 1):
        tell(UpdateTaskExecutionState("j1", f"s0:{s}:0", TaskState.RUNNING))
        tell(ScheduleOrUpdateConsumers("j1", f"s0:{s}:0", "s0", s, 0))
        tell(UpdateTaskExecutionState("j1", f"s0:{s}:0", TaskState.FINISHED))
    core.decide(state, core.Schedule("j1", {"tm-a": [0, 1]}), 1_000)
    for s in (0, 1):
        tell(UpdateTaskExecutionState("j1", f"c0:{s}:0", TaskState.RUNNING))
    job = state.jobs["j1"]
    assert [ex.state for ex in job.vertices["c0"].subtasks] == [TaskState.RUNNING, TaskState.RUNNING]
    return state, job


def test_a_registration_under_a_negative_subtask_is_stale_and_never_outlives_the_attempt() -> None:
    state, job = keyed_job_running()
    msg = NotifyKvStateRegistered("j1", "c0", KeyGroupRange(64, 127), "q0", "sid-forged", ADDR, "c0:-1:0")
    d = core.decide(state, core.Inbound("j1", Envelope(msg, "m"), CFG), 1_000)
    boom = UpdateTaskExecutionState("j1", "c0:1:0", TaskState.FAILED, "boom")
    failed = core.decide(state, core.Inbound("j1", Envelope(boom, "m"), CFG), 1_000)
    assert any(isinstance(f, TaskRestartScheduled) for f in failed.facts)
    assert not job.kvstate.locations, f"c0:1:0 failed and {rows(job)} is still served"
    assert [type(f) for f in d.facts] == [KvStateNotificationRefused] and "is stale" in d.note, d.facts


def test_an_ended_attempt_retires_only_state_no_range_points_to() -> None:
    state, job = keyed_job_running()
    sid = "sid-q0-c0:0:0"
    for msg in (
        NotifyKvStateRegistered("j1", "c0", KeyGroupRange(0, 63), "q0", sid, ADDR, "c0:0:0"),
        NotifyKvStateRegistered("j1", "c0", KeyGroupRange(64, 127), "q0", sid, ADDR, None),
    ):
        assert core.decide(state, core.Inbound("j1", Envelope(msg, "m"), CFG), 1_000).facts == [msg]
    boom = UpdateTaskExecutionState("j1", "c0:0:0", TaskState.FAILED, "boom")
    d = core.decide(state, core.Inbound("j1", Envelope(boom, "m"), CFG), 1_000)
    retired = {s for f in d.facts if isinstance(f, NotifyKvStateUnregistered) for s in f.state_ids}
    served = {e.state_id for loc in job.kvstate.locations.values() for e in loc.entries.values()}
    assert not retired & served, f"{sorted(retired & served)} retired (deleted) and still served: {rows(job)}"
