"""On a real Redis, with the real JobManager and TaskManager shells (workers played by the
test): a graph with an unknown reader option is refused by the JobManager (whoever built it),
naming the vertex and the known options; and a FAILED report the worker found deterministic
goes through Redis (as version 4) and fails the job at once, without a restart."""

from __future__ import annotations

from pathlib import Path

from sluice.events import (
    JobGraph,
    JobRefused,
    JobStatus,
    JobVertex,
    RestartStrategy,
    SinkSpec,
    SourceSpec,
    TaskRestartScheduled,
    TaskState,
    UpdateTaskExecutionState,
)
from sluice.events.descriptor import descriptor_from_json
from sluice.services.taskmanager.worker import report_state
from sluice.store import EventLog
from tests.services.failover_helpers import events, job_state, pump, report, source_graph, started, submit


def test_the_jobmanager_refuses_an_unknown_reader_option_naming_the_vertex_and_the_known_ones(
    log: EventLog, tmp_path: Path
) -> None:
    world, a, t, _ = started(log, tmp_path)
    src = JobVertex(
        "flights",
        "source",
        1,
        [],
        SourceSpec("csv", [str(tmp_path / "f.csv")], 100, {"delimiter": ";", "mode": "lenient"}),
        SinkSpec("parquet", f"file://{tmp_path}/out"),
    )
    reply = log.keys.inbox(log.keys.client("c1"))
    submit(log, world, "j1", JobGraph("j", [src], [], 128, RestartStrategy()))
    pump([lambda: a.step(block_ms=None)], lambda: bool(events(log, reply, JobRefused)), what="the refusal")
    (refused,) = events(log, reply, JobRefused)
    assert "source 'flights': option 'delimiter' is not a csv reader option (Sluice spells it 'sep'); known: " in (
        refused.reason
    )
    assert "source 'flights': option 'mode' is 'lenient'; use one of PERMISSIVE, DROPMALFORMED, FAILFAST" in (
        refused.reason
    )
    assert "j1" not in a.state.jobs.jobs


def test_a_deterministic_failure_goes_as_v4_and_fails_the_job_without_a_restart(log: EventLog, tmp_path: Path) -> None:
    world, a, t, slots = started(log, tmp_path)
    steps = [lambda: a.step(block_ms=None), a.step_lease, lambda: t.step(block_ms=None)]
    submit(log, world, "j1", source_graph("j1"))
    pump(steps, lambda: len(slots.launched) == 1, what="the deployment", world=world, advance_ms=10)
    _, d, _ = slots.launched[0]
    assert descriptor_from_json(d).no_retry_on == []
    report(log, world, d, "tm-1", 0, TaskState.RUNNING)
    why = "Spark error CAST_INVALID_INPUT is deterministic (...)\nTraceback (most recent call last): ..."
    report_state(log, world, descriptor_from_json(d), "tm-1", 0, TaskState.FAILED, error=why, retryable=False)
    inbox = log.keys.inbox(log.keys.job("j1"))
    pump(
        steps,
        lambda: job_state(log, "j1").status == JobStatus.FAILED,
        what="the job failing",
        world=world,
        advance_ms=10,
    )
    job = job_state(log, "j1")
    assert job.restarts == 0 and job.reason == f"task src[0] failed (no restart): {why}"
    facts = log.keys.facts(log.keys.job("j1"))
    assert events(log, facts, TaskRestartScheduled) == []
    sent = [u for u in events(log, inbox, UpdateTaskExecutionState) if u.state == TaskState.FAILED]
    assert [u.retryable for u in sent] == [False]  # (a v3 entry would read as retryable)
