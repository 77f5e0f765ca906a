"""The KvState registry, pure: every rule of Flink's KvStateLocationRegistry as events,
what a task's failure releases, disposing, and replay = live."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.api import Job
from sluice.events import (
    CancelJob,
    DisposeJob,
    Envelope,
    JobDisposed,
    JobGraph,
    JobRefused,
    JobStatus,
    KeyGroupRange,
    KvStateNotificationRefused,
    NotifyKvStateRegistered,
    NotifyKvStateUnregistered,
    RestartStrategy,
    SubmitTask,
    TaskQueryable,
    TaskState,
)
from sluice.services.jobs import core
from sluice.services.jobs.state import JobsState
from sluice.services.kvstate import core as kvcore
from sluice.services.kvstate.registry import KvStateRegistry, location_row
from tests.cores import JobsDriven
from tests.services import jobfixtures

V = "count -> out"  # the keyed vertex (its sink chained in)
SRC = "lines -> tokenize"
ADDR = "redis://127.0.0.1:6379/0"


def graph(reducers: int = 2, restart: RestartStrategy | None = None) -> JobGraph:
    j = Job("wc", restart=restart or RestartStrategy("fixed-delay", 2, 100))
    words = j.read_text("lines", "/data/in.txt", parallelism=2).map("tokenize", jobfixtures.identity)
    words.key_by("word").map("count", jobfixtures.count, parallelism=reducers, queryable="counts").write_parquet(
        "out", "/data/out"
    )
    return j.graph()


def running(reducers: int = 2, restart: RestartStrategy | None = None) -> tuple[JobsDriven, list[SubmitTask]]:
    """A job whose sources finished and whose keyed tasks run."""
    sim = JobsDriven(graph(reducers, restart), {"tm-1": 4, "tm-2": 4})
    for task in sim.schedule():
        sim.run_to_end(task)
    consumers = sim.schedule()
    assert [t.vertex_id for t in consumers] == [V] * reducers
    for t in consumers:
        sim.report(t, TaskState.RUNNING)
    return sim, consumers


def reg(
    task: SubmitTask,
    name: str = "counts",
    vertex: str | None = None,
    rng: tuple[int, int] | None = None,
    job: str = "j1",
) -> NotifyKvStateRegistered:
    start, end = rng or (task.descriptor.queryable and _range(task))
    return NotifyKvStateRegistered(
        job,
        vertex or task.vertex_id,
        KeyGroupRange(start, end),
        name,
        f"sid-{task.execution_id}",
        ADDR,
        task.execution_id,
    )


def _range(task: SubmitTask) -> tuple[int, int]:
    from sluice.services.dataplane.keygroups import key_group_range

    d = task.descriptor
    return key_group_range(d.max_parallelism, d.parallelism, d.subtask)


def unreg(name: str = "counts", vertex: str = V, rng: tuple[int, int] = (0, 63), job: str = "j1"):
    return NotifyKvStateUnregistered(job, vertex, KeyGroupRange(*rng), name)


def refused(sim: JobsDriven) -> list[str]:
    return [f.reason for f in sim.log if isinstance(f, KvStateNotificationRefused)]


def test_the_descriptor_names_the_state_and_its_key() -> None:
    _, tasks = running()
    assert tasks[0].descriptor.queryable == TaskQueryable("counts", "word")


def test_the_first_registration_creates_the_location_and_later_ones_fill_it() -> None:
    sim, (t0, t1) = running()
    d = sim.tell(reg(t0))
    assert d.facts == [reg(t0)] and d.note is None
    loc = sim.job.kvstate.locations["counts"]
    assert (loc.vertex, loc.num_key_groups, loc.registered_key_groups) == (V, 128, 64)
    sim.tell(reg(t1))
    row = location_row(sim.job.kvstate.locations["counts"])
    assert [(r["start"], r["end"], r["state_id"], r["address"]) for r in row["ranges"]] == [
        (0, 63, f"sid-{t0.execution_id}", ADDR),
        (64, 127, f"sid-{t1.execution_id}", ADDR),
    ]
    assert loc.entry_for(70).state_id == f"sid-{t1.execution_id}" and loc.entry_for(63).start == 0


def test_a_name_registered_by_another_vertex_is_a_clash_that_fails_the_vertex_without_restart() -> None:
    sim, (t0, _) = running()
    sim.tell(reg(t0))
    d = sim.tell(NotifyKvStateRegistered("j1", SRC, KeyGroupRange(64, 127), "counts", "sid-x", ADDR))
    assert "registration name clash" in d.note and f"vertex {SRC!r}" in d.note and f"vertex {V!r}" in d.note
    assert sim.job.status in (JobStatus.FAILING, JobStatus.FAILED) and sim.job.restarts == 0
    assert "(no restart)" in sim.job.reason and SRC in sim.job.reason and V in sim.job.reason
    assert refused(sim) == [d.note]
    # The clash did not touch the first vertex's registration... until the job failed.
    assert sim.job.kvstate.locations.get("counts") is None or sim.job.kvstate.locations["counts"].vertex == V


def test_unregistering_an_unknown_name_is_an_error_naming_the_race() -> None:
    sim, _ = running()
    d = sim.tell(unreg("nope"))
    assert d.note.startswith("unknown registration name 'nope' in job j1: probably a registration/unregistration race")
    assert [type(f) for f in d.facts] == [KvStateNotificationRefused]
    assert sim.job.status == JobStatus.RUNNING


def test_unregistering_from_the_wrong_vertex_is_an_error() -> None:
    sim, (t0, _) = running()
    sim.tell(reg(t0))
    d = sim.tell(unreg(vertex=SRC))
    assert d.note == f"vertex {SRC!r} cannot unregister KvState 'counts': another operator ({V!r}) registered it"
    assert sim.job.kvstate.locations["counts"].registered_key_groups == 64


def test_a_key_group_range_outside_the_max_parallelism_is_an_error() -> None:
    sim, (t0, _) = running()
    for msg in (reg(t0, rng=(64, 128)), reg(t0, rng=(-1, 3)), reg(t0, rng=(9, 3))):
        d = sim.tell(msg)
        assert "is outside 0..127 (the job's max parallelism is 128)" in d.note
    assert "counts" not in sim.job.kvstate.locations
    sim.tell(reg(t0))
    d = sim.tell(unreg(rng=(0, 200)))
    assert "key-group range 0..200 of 'counts' is outside 0..127" in d.note
    assert sim.job.kvstate.locations["counts"].registered_key_groups == 64


def test_a_notification_for_a_job_that_is_not_running_gets_job_not_found() -> None:
    sim, (t0, _) = running()
    d = sim.tell(reg(t0, job="other"))
    assert d.note.startswith("job not found: other (no such job)")
    sim.tell(CancelJob("j1", "bye"))
    for msg in (reg(t0), unreg()):
        d = sim.tell(msg)
        assert d.note.startswith("job not found: j1 (it is CANCEL")
    d = core.decide(JobsState(), core.Inbound("ghost", Envelope(reg(t0, job="ghost"), "x"), core.JobsConfig()), 1)
    assert d.note == "job ghost not found" and not d.facts


def test_the_location_goes_when_its_last_key_group_is_unregistered() -> None:
    sim, (t0, t1) = running()
    sim.tell(reg(t0)), sim.tell(reg(t1))
    d = sim.tell(unreg(rng=(0, 63)))
    assert d.facts == [NotifyKvStateUnregistered("j1", V, KeyGroupRange(0, 63), "counts", [f"sid-{t0.execution_id}"])]
    assert sim.job.kvstate.locations["counts"].registered_key_groups == 64
    sim.tell(unreg(rng=(64, 100)))  # part of a range: the rest stays registered
    loc = sim.job.kvstate.locations["counts"]
    assert [(e.start, e.end) for e in loc.entries.values()] == [(101, 127)]
    sim.tell(unreg(rng=(101, 127)))
    assert "counts" not in sim.job.kvstate.locations


def test_a_failed_attempt_is_unregistered_with_its_failure_and_its_replacement_registers_again() -> None:
    sim, (t0, t1) = running()
    sim.tell(reg(t0)), sim.tell(reg(t1))
    d = sim.report(t0, TaskState.FAILED, "boom")
    unregs = [f for f in d.facts if isinstance(f, NotifyKvStateUnregistered)]
    assert unregs == [NotifyKvStateUnregistered("j1", V, KeyGroupRange(0, 63), "counts", [f"sid-{t0.execution_id}"])]
    kinds = [type(f).__name__ for f in d.facts]
    assert kinds.index("NotifyKvStateUnregistered") < kinds.index("TaskRestartScheduled")
    # The old attempt is stale now: its late registration is refused.
    d = sim.tell(reg(t0))
    assert "is stale" in d.note and sim.job.kvstate.locations["counts"].registered_key_groups == 64
    sim.now += 1000
    (t0b,) = sim.schedule()
    assert (t0b.subtask, t0b.attempt) == (0, 1)
    sim.report(t0b, TaskState.RUNNING)
    sim.tell(reg(t0b))
    assert sim.job.kvstate.locations["counts"].entry_for(5).state_id == f"sid-{t0b.execution_id}"
    # A finished task keeps its registration: a finished job's state stays queryable.
    sim.report(t0b, TaskState.FINISHED), sim.report(t1, TaskState.FINISHED)
    assert sim.job.status == JobStatus.FINISHED
    assert sim.job.kvstate.locations["counts"].registered_key_groups == 128


def test_a_cancelled_job_unregisters_everything() -> None:
    sim, (t0, t1) = running()
    sim.tell(reg(t0)), sim.tell(reg(t1))
    sim.tell(CancelJob("j1", "bye"))
    for t in (t0, t1):
        sim.report(t, TaskState.CANCELED)
    assert sim.job.status == JobStatus.CANCELED and sim.job.kvstate.locations == {}


def test_disposing_needs_an_ended_job_and_releases_every_location() -> None:
    sim, (t0, t1) = running()
    sim.tell(reg(t0)), sim.tell(reg(t1))
    facts, reply = kvcore.dispose(sim.state, DisposeJob("j1", "inbox"))
    assert (
        facts == []
        and isinstance(reply, JobRefused)
        and "is RUNNING" in reply.reason
        and "sluice cancel j1" in reply.reason
    )
    facts, reply = kvcore.dispose(sim.state, DisposeJob("nope", "inbox"))
    assert reply.reason.startswith("job not found: nope")
    for t in (t0, t1):
        sim.report(t, TaskState.FINISHED)
    facts, reply = kvcore.dispose(sim.state, DisposeJob("j1", "inbox"))
    assert (
        facts
        == [reply]
        == [JobDisposed("j1", ["counts"], sorted([f"sid-{t0.execution_id}", f"sid-{t1.execution_id}"]))]
    )
    sim.commit(*facts)  # committed, then folded (dispose_job)
    assert sim.job.kvstate.locations == {} and sim.job.kvstate.disposed


# --- replay = live ------------------------------------------------------------------------------

ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(["reg", "unreg", "fail", "restart", "clash", "bad"]),
        st.integers(0, 2),
        st.integers(0, 127),
        st.integers(0, 127),
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(ACTIONS)
def test_replaying_the_facts_gives_the_live_registry(actions) -> None:
    sim, _ = running(reducers=3, restart=RestartStrategy("fixed-delay", 100, 0))
    for kind, sub, a, b in actions:
        ex = sim.job.vertices[V].subtasks[sub]
        task = SubmitTask(
            "j1",
            ex.id,
            V,
            sub,
            ex.attempt,
            0,
            SimpleNamespace(  # type: ignore[arg-type]
                queryable=1, max_parallelism=128, parallelism=3, subtask=sub
            ),
        )
        if kind == "reg":
            sim.tell(reg(task))
        elif kind == "unreg":
            sim.tell(unreg(rng=(min(a, b), max(a, b))))
        elif kind == "fail" and ex.state == TaskState.RUNNING:
            sim.report(task, TaskState.FAILED, "x")
        elif kind == "restart":
            sim.now += 1
            for t in sim.schedule():
                sim.report(t, TaskState.RUNNING)
        elif kind == "clash":
            sim.tell(NotifyKvStateRegistered("j1", SRC, KeyGroupRange(0, 1), "counts", "s", ADDR))
        elif kind == "bad":
            sim.tell(reg(task, rng=(a, 130)))
    live = sim.job.kvstate
    replayed = sim.replayed().jobs["j1"].kvstate
    assert rows(replayed) == rows(live)
    # The projector's fold (the registry's evolve alone) gives the same table.
    alone = KvStateRegistry()
    for fact in sim.log:
        from sluice.services.kvstate.registry import evolve as kv_evolve

        kv_evolve(alone, fact)
    assert rows(alone) == rows(live)


def rows(reg_: KvStateRegistry) -> dict:
    return {n: location_row(loc) for n, loc in reg_.locations.items()}


# --- validation -------------------------------------------------------------------------------


def test_queryable_state_needs_a_keyed_vertex_and_a_unique_name() -> None:
    from sluice.events import JobEdge, JobVertex, SourceSpec
    from sluice.services.jobs.validate import problems

    src = JobVertex("src", "source", 2, source=SourceSpec("text", ["/x"], 100))
    fn = "tests.services.jobfixtures:identity"
    g = JobGraph("q", [src, JobVertex("a", "transform", 2, [fn], queryable="n")], [JobEdge("src", "a", "forward")])
    assert (
        "vertex 'a' declares queryable state 'n' but is not keyed: its state is found by key, so key its input "
        "first (stream.key_by('col').map(..., queryable=...))"
    ) in problems(g)
    g = JobGraph(
        "q",
        [
            src,
            JobVertex("a", "transform", 2, [fn], queryable="n"),
            JobVertex("b", "transform", 2, [fn], queryable="n", sink=None),
        ],
        [JobEdge("src", "a", "keyed", "k"), JobEdge("a", "b", "keyed", "k")],
    )
    found = problems(g)
    assert any("queryable state name 'n' is declared by 2 vertices ('a', 'b')" in p for p in found)
    g = JobGraph("q", [src, JobVertex("a", "transform", 2, [fn], queryable=" ")], [JobEdge("src", "a", "keyed", "k")])
    assert any("use a non-empty name" in p for p in problems(g))
