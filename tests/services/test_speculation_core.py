"""Speculative execution in the pure jobs core (services/jobs/speculation.py): the slow-task
detector, a speculative attempt placed on another TaskManager, exactly one winner whatever
order both attempts report in, consumers reading only the winner, and the log folded from
scratch giving the live state (checked at teardown by tests/cores.py)."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.errors import ConfigError
from sluice.events import (
    AttemptWon,
    CancelTask,
    Envelope,
    JobEdge,
    JobGraph,
    JobStatus,
    JobVertex,
    RestartStrategy,
    SinkSpec,
    SourceSpec,
    SpeculativeAttemptScheduled,
    SubmitTask,
    TaskOperationResult,
    TaskRestartScheduled,
    TaskState,
)
from sluice.services.jobmanager.snapshot_codec import decode_job, encode_job, install_job, job_snapshot
from sluice.services.jobs import core
from sluice.services.jobs.machine import HOLDS_SLOT
from sluice.services.jobs.speculation import Speculate, SpeculationConfig, slow_attempts
from sluice.services.jobs.state import JobsState, evolve
from tests.cores import CFG, JobsDriven

FN = "tests.services.jobfixtures:identity"
ON = SpeculationConfig(enabled=True, baseline_lower_bound_ms=0)


def graph(parallelism: int = 4) -> JobGraph:
    """Sources s0 -> a transform t0 (the vertex speculated) -> a sink c0."""
    src = JobVertex("s0", "source", parallelism, source=SourceSpec("text", ["/x"], 100))
    t0 = JobVertex("t0", "transform", parallelism, [FN])
    c0 = JobVertex("c0", "transform", 1, [FN], sink=SinkSpec("parquet", "/out"))
    edges = [JobEdge("s0", "t0", "forward"), JobEdge("t0", "c0", "keyed", "word")]
    return JobGraph("g", [src, t0, c0], edges, 128, RestartStrategy("fixed-delay", 3, 0))


def transforms(d: JobsDriven) -> list[SubmitTask]:
    """The sources run to their end; the transforms t0 deployed (and running)."""
    for t in d.schedule():
        d.run_to_end(t)
    tasks = d.schedule()
    assert [t.vertex_id for t in tasks] == ["t0"] * 4
    for t in tasks:
        d.report(t, TaskState.RUNNING)
    return tasks


def straggling(config: SpeculationConfig = ON) -> tuple[JobsDriven, SubmitTask, SubmitTask]:
    """Four transforms on tm-a and tm-b; three finish in 1 s, t0[3] runs on: at 3 s it is slow,
    and its speculative attempt goes to another TaskManager. Returns the driven core, the
    original, the speculative."""
    d = JobsDriven(graph(), {"tm-a": 2, "tm-b": 2})
    tasks = transforms(d)
    d.slots = {"tm-a": 2, "tm-b": 2, "tm-c": 2}
    d.advance(1_000)
    for t in tasks[:3]:
        d.run_to_end(t)
    original = tasks[3]
    d.advance(2_000)
    decision = d.tell(Speculate("j1", config, d.free()))
    specs = [f for f in decision.facts if isinstance(f, SpeculativeAttemptScheduled)]
    assert [(s.vertex_id, s.subtask, s.attempt, s.original) for s in specs] == [("t0", 3, 1, 0)]
    placed = d.schedule()
    assert len(placed) == 1
    return d, original, placed[0]


def test_speculation_is_off_by_default_and_then_decides_nothing() -> None:
    d = JobsDriven(graph(), {"tm-a": 2, "tm-b": 2, "tm-c": 2})
    tasks = transforms(d)
    for t in tasks[:3]:
        d.run_to_end(t)
    d.advance(10_000_000)
    assert not d.tell(Speculate("j1", SpeculationConfig(), d.free())).facts
    assert SpeculationConfig().enabled is False


@pytest.mark.parametrize(
    ("field", "value", "hint"),
    [
        ("baseline_ratio", 0.0, "(0, 1]"),
        ("baseline_ratio", 1.5, "(0, 1]"),
        ("baseline_multiplier", 0.5, ">= 1"),
        ("baseline_lower_bound_ms", -1, ">= 0"),
        ("max_concurrent", 1, "2 or more"),
    ],
)
def test_a_bad_setting_is_refused_naming_it_and_the_fix(field: str, value: float, hint: str) -> None:
    with pytest.raises(ConfigError, match=field) as err:
        SpeculationConfig(enabled=True, **{field: value})
    assert hint in str(err.value)


def test_the_detector_waits_for_the_baseline_ratio_and_respects_the_lower_bound() -> None:
    d = JobsDriven(graph(), {"tm-a": 4})
    tasks = transforms(d)
    d.advance(1_000)
    for t in tasks[:2]:
        d.run_to_end(t)  # 2 of 4 finished: below 0.75
    d.advance(60_000)
    assert slow_attempts(d.job, d.now, ON) == []
    d.run_to_end(tasks[2])
    slow = slow_attempts(d.job, d.now, ON)
    assert [(s.execution.id, s.baseline_ms) for s in slow] == [("t0:3:0", 1_500)]
    assert slow_attempts(d.job, d.now, SpeculationConfig(enabled=True, baseline_lower_bound_ms=10**9)) == []


def test_the_speculative_attempt_wins_the_original_is_cancelled_and_consumers_read_the_winner() -> None:
    d, original, spec = straggling()
    there = d.job.vertices["t0"].subtasks[3].taskmanager
    assert there is not None and d.job.attempt_of(spec.execution_id).taskmanager != there, "it runs elsewhere"
    d.report(spec, TaskState.RUNNING)
    d.produce(spec)
    won = [f for f in d.log if isinstance(f, AttemptWon)]
    assert [(w.attempt, w.losers) for w in won] == [(1, [0])]
    cancels = [ev for _, ev in d.sent if isinstance(ev, CancelTask)]
    assert [c.execution_id for c in cancels] == [original.execution_id]
    d.report(spec, TaskState.FINISHED)
    (consumer,) = d.schedule()
    paths = consumer.descriptor.inputs[0].partition_paths()
    assert core.partition_path("file:///s", "j1", "t0", 3, 1) in paths
    assert core.partition_path("file:///s", "j1", "t0", 3, 0) not in paths
    d.report(original, TaskState.FINISHED)  # it finished before the cancel reached it
    assert d.job.vertices["t0"].concurrent == {}
    d.run_to_end(consumer)
    assert d.job.status == JobStatus.FINISHED
    assert d.state.pool.holders() == []


def test_the_original_wins_and_the_speculative_attempt_is_cancelled() -> None:
    d, original, spec = straggling()
    d.report(spec, TaskState.RUNNING)
    d.report(original, TaskState.FINISHED)
    assert [(w.attempt, w.losers) for w in d.log if isinstance(w, AttemptWon)] == [(0, [1])]
    assert d.job.attempt_of(spec.execution_id).state == TaskState.CANCELING
    d.report(spec, TaskState.CANCELED)
    assert d.job.vertices["t0"].concurrent == {}
    assert d.job.vertices["t0"].subtasks[3].attempt == 0


def test_a_failure_of_either_attempt_is_not_restarted_while_the_other_runs() -> None:
    d, original, spec = straggling()
    d.tell(TaskOperationResult("j1", spec.execution_id, False, "no room"))
    assert d.job.vertices["t0"].concurrent == {} and d.job.vertices["t0"].subtasks[3].attempt == 0
    d.advance(10_000)
    d.tell(Speculate("j1", ON, d.free()))
    (again,) = d.schedule()
    assert again.attempt == 2, "a speculative attempt is numbered above every attempt of its subtask"
    d.report(original, TaskState.FAILED, "disk full")
    assert d.job.vertices["t0"].subtasks[3].attempt == 2, "the speculative attempt carries on in its place"
    assert not [f for f in d.log if isinstance(f, TaskRestartScheduled)]
    d.report(again, TaskState.FAILED, "disk full again")
    (restart,) = [f for f in d.log if isinstance(f, TaskRestartScheduled)]
    assert restart.attempt == 3


def test_no_speculative_attempt_without_a_free_slot_on_another_taskmanager() -> None:
    d = JobsDriven(graph(), {"tm-a": 4})
    tasks = transforms(d)
    d.advance(1_000)
    for t in tasks[:3]:
        d.run_to_end(t)
    d.advance(5_000)
    decision = d.tell(Speculate("j1", ON, d.free()))
    assert not decision.facts and "no other TaskManager" in str(decision.instructions)


REPORTS = st.lists(
    st.tuples(
        st.sampled_from(["original", "speculative"]),
        st.sampled_from(["running", "produce", "finished", "failed", "canceled", "deploy-failed"]),
    ),
    max_size=12,
)


def play(d: JobsDriven, original: SubmitTask, spec: SubmitTask, reports: list[tuple[str, str]]) -> Iterator[None]:
    """Both attempts report ``reports`` in their order (a step after each)."""
    tasks = {"original": original, "speculative": spec}
    for who, what in reports:
        t = tasks[who]
        if what == "produce":
            d.produce(t)
        elif what == "deploy-failed":
            d.tell(TaskOperationResult("j1", t.execution_id, False, "boom"))
        else:
            d.report(t, TaskState[what.upper()], "boom" if what == "failed" else None)
        yield


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reports=REPORTS)
def test_whatever_order_both_attempts_report_in_there_is_exactly_one_winner(reports: list[tuple[str, str]]) -> None:
    d, original, spec = straggling()
    for _ in play(d, original, spec, reports):
        vertex = d.job.vertices["t0"]
        current = vertex.subtasks[3]
        others = vertex.concurrent.get(3, [])
        racing = [o for o in [current, *others] if not o.state.terminal and o.state != TaskState.CANCELING]
        assert len(racing) <= 2
        if current.produced or current.state == TaskState.FINISHED:
            assert all(o.state == TaskState.CANCELING for o in others), "a winner leaves no rival running"
        assert len(others) + 1 <= ON.max_concurrent
        held = {eid for _, _, _, eid in d.state.pool.holders()}
        for ex in d.job.executions():
            assert (ex.state in HOLDS_SLOT) == (ex.id in held), f"{ex.id} {ex.state} and the pool {held} disagree"
    winners = [(w.attempt, tuple(w.losers)) for w in d.log if isinstance(w, AttemptWon) and w.losers]
    assert len(winners) <= 1, f"more than one winner: {winners}"
    vertex = d.job.vertices["t0"]
    assert vertex.finished == sum(ex.state == TaskState.FINISHED for ex in vertex.subtasks)
    assert vertex.produced == sum(ex.produced for ex in vertex.subtasks)
    assert vertex.started == sum(ex.state in (TaskState.RUNNING, TaskState.FINISHED) for ex in vertex.subtasks)


def test_a_source_is_never_speculated_its_splits_go_to_one_attempt() -> None:
    d = JobsDriven(graph(), {"tm-a": 4, "tm-b": 4})
    sources = d.schedule()
    for t in sources:
        d.report(t, TaskState.RUNNING)
    d.advance(1_000)
    for t in sources[:3]:
        d.run_to_end(t)
    d.advance(100_000)
    assert slow_attempts(d.job, d.now, ON) == []
    assert not d.tell(Speculate("j1", ON, d.free())).facts


def test_the_jobmanager_setting_reads_off_on_and_a_multiplier_with_a_minimum() -> None:
    assert SpeculationConfig.parse(None) == SpeculationConfig() == SpeculationConfig.parse(" OFF ")
    assert SpeculationConfig.parse("on") == SpeculationConfig(enabled=True)
    assert SpeculationConfig.parse("2,30000") == SpeculationConfig(
        enabled=True, baseline_multiplier=2.0, baseline_lower_bound_ms=30_000
    )
    for bad in ("fast", "0.5,100", "2"):
        with pytest.raises(ConfigError, match=f"speculation = '{bad}' is not a speculation setting: give 'off'"):
            SpeculationConfig.parse(bad)


def test_losing_the_speculative_attempts_taskmanager_leaves_the_original_running() -> None:
    d, original, spec = straggling()
    where = d.job.attempt_of(spec.execution_id).taskmanager
    d.tell(core.TaskManagerGone(where, "lost", CFG))
    vertex = d.job.vertices["t0"]
    assert vertex.concurrent == {} and vertex.subtasks[3].attempt == 0
    assert vertex.subtasks[3].state == TaskState.RUNNING
    assert not [f for f in d.log if isinstance(f, TaskRestartScheduled)]


def test_a_log_restart_ends_the_speculative_attempt_and_restarts_the_subtask_above_it() -> None:
    d, original, spec = straggling()
    d.report(spec, TaskState.RUNNING)
    d.tell(core.LogRestart("redis restarted", 1))
    vertex = d.job.vertices["t0"]
    assert vertex.concurrent == {}
    (restart,) = [f for f in d.log if isinstance(f, TaskRestartScheduled) and f.vertex_id == "t0"]
    assert restart.attempt == 2
    assert d.state.pool.holders() == [h for h in d.state.pool.holders() if not h[3].startswith("t0:3:")]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reports=REPORTS, cut=st.integers(0, 10_000))
def test_a_snapshot_at_any_fact_and_the_rest_of_the_log_give_the_live_state(
    reports: list[tuple[str, str]], cut: int
) -> None:
    d, original, spec = straggling()
    for _ in play(d, original, spec, reports):
        pass
    k = cut % (len(d.timed) + 1)
    head = JobsState()
    for fact, at in d.timed[:k]:
        evolve(head, Envelope(fact, "", 0, at))
    rebuilt = JobsState()
    for job_id in head.jobs:
        data = encode_job(job_snapshot(head, job_id))
        snap = decode_job(data, job_id)
        assert encode_job(snap) == data, "a fixed point: nothing lost, nothing added"
        install_job(rebuilt, snap)
    for fact, at in d.timed[k:]:
        evolve(rebuilt, Envelope(fact, "", 0, at))
    live = d.normalized(copy.deepcopy(d.state))
    rebuilt = d.normalized(rebuilt)
    assert rebuilt.jobs == live.jobs
    assert rebuilt.pool.holders() == live.pool.holders()  # (a TaskManager with nothing held counts as absent)


def test_a_cancelled_attempt_that_never_published_is_swept_and_a_published_one_stays() -> None:
    from sluice.services.dataplane.publish import abandoned, marker_name, part_name

    winner = [part_name(3, 0, 0, "parquet"), marker_name(3, 0)]
    partial = [part_name(3, 1, 0, "parquet")]  # the loser, newer, killed halfway through its moves
    assert abandoned([*winner, *partial], 3, 1) == tuple(partial)
    assert abandoned([*winner, *partial, marker_name(3, 1)], 3, 1) == ()  # complete: it may count
    assert abandoned([*winner, part_name(4, 1, 0, "parquet")], 3, 1) == ()  # another subtask's
