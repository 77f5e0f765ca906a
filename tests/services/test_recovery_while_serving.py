"""A new leader serves before every job is rebuilt (services/jobmanager/process.py,
``serve_after_s``), as Flink's Dispatcher leads while its JobMasters recover: on a real
Redis, driven step by step, with a replay of one fact per step so the rebuild of a job
spans many steps.

While a job is being rebuilt the leader answers the cluster (registrations, heartbeats,
new jobs), leaves that job's inbox unread, says nothing of its attempts to the
TaskManagers (a slot report naming one is neither a task to cancel nor a final state to
confirm), and schedules nothing (the slots the job holds are not known yet). Once it is
rebuilt it is served as if the leader had waited for it: the same state as a replay of
its log, its waiting messages answered once, new tasks placed beside its own.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sluice.events import (
    CancelTask,
    DisposeJob,
    Envelope,
    JobRefused,
    JobStatus,
    LeadershipGranted,
    NextInputSplit,
    RequestNextInputSplit,
    SubmitTask,
    TaskManagerLost,
    TaskManagerRegistered,
    TaskState,
    TaskStatesRecorded,
    UpdateTaskExecutionState,
)
from sluice.services.jobs.state import JobsState
from sluice.store import EventLog
from tests.services.failover_helpers import (
    ManualWorld,
    TinySlots,
    events,
    jm,
    job_state,
    lead,
    pump,
    report,
    source_graph,
    started,
    submit,
)
from tools.sim.invariants import normal_jobs

REQUESTS = 15


def _a_long_running_job(
    log: EventLog, tmp_path: Path, last_words: Callable[[Any], None] | None = None
) -> tuple[ManualWorld, Any, Any, TinySlots, dict]:
    """Leader ``jm-a`` runs job ``big`` (one source subtask on tm-1, which has 2 slots) that
    took ``REQUESTS`` splits; then (after ``last_words(jm-a)``) it steps down and lets its
    lease go. Returns the world, the old leader, the TaskManager, its slots and the
    source's descriptor."""
    world, a, t, slots = started(log, tmp_path, n=2)
    steps = [lambda: a.step(block_ms=None), a.step_lease, lambda: t.step(block_ms=None)]
    submit(log, world, "big", source_graph("big", splits=40))
    pump(steps, lambda: len(slots.launched) == 1, what="big's deployment", world=world, advance_ms=10)
    src = slots.launched[0][1]
    report(log, world, src, "tm-1", slots.launched[0][0], TaskState.RUNNING)
    for _ in range(REQUESTS):
        _ask(log, world, src)
    facts = log.keys.facts(log.keys.job("big"))
    pump(
        steps,
        lambda: len(events(log, facts, NextInputSplit)) == REQUESTS,
        what="the splits answered",
        world=world,
        advance_ms=10,
    )
    if last_words is not None:
        last_words(a)
    a.job_inboxes.close_coordinators()
    a.step_down()
    a.lease.release()
    return world, a, t, slots, src


def _ask(log: EventLog, world: ManualWorld, src: dict) -> None:
    inbox = log.keys.inbox(log.keys.job("big"))
    log.append(
        inbox,
        Envelope(
            RequestNextInputSplit("big", "src", 0, src["execution_id"], "host-a"),
            world.new_id(),
            0,
            world.now_ms(),
            "big",
        ),
    )


def _replayed(log: EventLog, job_id: str) -> dict:
    state = JobsState()
    state.jobs[job_id] = job_state(log, job_id)
    out = normal_jobs(state)
    out.pop("_pool")
    return out


def _leader_view(b: Any, job_id: str) -> dict:
    out = normal_jobs(JobsState({job_id: b.state.jobs.jobs[job_id]}))
    out.pop("_pool")
    return out


def test_a_new_leader_serves_while_a_long_job_is_rebuilt(log: EventLog, tmp_path: Path) -> None:
    keys = log.keys
    world, _, t, slots, src = _a_long_running_job(log, tmp_path)
    big_slot = slots.launched[0][0]
    b = jm(log, world, "jm-b", tmp_path, replay_page=1, serve_after_s=0.0)
    assert lead(b, world) == 2
    assert b.recovering == ["big"] and "big" not in b.state.jobs.jobs
    grants = events(log, keys.facts(keys.cluster), LeadershipGranted)
    assert [g.epoch for g in grants] == [1, 2]  # it announced its epoch before rebuilding the job

    # While big is rebuilt: a new job is accepted and built, a request to big waits, and
    # the TaskManager's slot reports (naming big's attempt) go on, past the grace period.
    submit(log, world, "new", source_graph("new"))
    _ask(log, world, src)
    steps = [lambda: b.step(block_ms=None), b.step_lease, lambda: t.step(block_ms=None)]
    pump(
        steps,
        lambda: "new" in b.state.jobs.jobs and b.state.jobs.jobs["new"].built,
        what="the new job built",
        world=world,
        advance_ms=100,
        rounds=10,
    )
    for _ in range(8):  # 8 s on the test clock: the heartbeat timeout (the grace) is 5 s
        for step in steps:
            step()
        world.advance(1000)
    assert b.recovering == ["big"], "the rebuild was too short to show anything: make the job's log longer"
    assert len(slots.launched) == 1  # nothing scheduled while big's slots are unknown
    assert t.reg.state == "REGISTERED" and b.state.membership.is_registered("tm-1", t.reg.session or "")

    pump(steps, lambda: not b.recovering, what="big rebuilt", world=world, advance_ms=10, rounds=200)
    pump(steps, lambda: len(slots.launched) == 2, what="the new job's deployment", world=world, advance_ms=10)
    assert b.errors == []
    assert _leader_view(b, "big") == _replayed(log, "big")
    assert b.state.jobs.jobs["big"].status == JobStatus.RUNNING
    assert slots.launched[1][0] != big_slot, "the new job's task was placed in the slot big holds"
    # Nothing was said of big's attempt while it was unknown: no cancel, no confirmation.
    tm_inbox = keys.inbox(keys.taskmanager("tm-1"))
    assert not [c for c in events(log, tm_inbox, CancelTask) if c.job_id == "big"]
    assert not [r for r in events(log, tm_inbox, TaskStatesRecorded) if any(x.startswith("big/") for x in r.tasks)]
    assert len([s for s in events(log, tm_inbox, SubmitTask)]) == 2
    # The request sent during the rebuild was answered once, at the new epoch.
    answers = [
        (e.epoch, e.event) for _, e in log.replay(keys.facts(keys.job("big"))) if isinstance(e.event, NextInputSplit)
    ]
    assert len(answers) == REQUESTS + 1 and answers[-1][0] == 2 and answers[-1][1].split is not None
    b.job_inboxes.close_coordinators()


def test_a_taskmanager_lost_and_back_while_a_job_is_rebuilt_fails_that_jobs_attempts_there(
    log: EventLog, tmp_path: Path
) -> None:
    """tm-1 goes quiet past the heartbeat timeout while ``big`` is being rebuilt: the leader
    declares it lost (its tasks are dropped there) and tm-1 registers again under the same
    session. When ``big`` joins, its attempt on tm-1 fails at once for that reason (as it
    would have, had the job been rebuilt), not later as "missing" from a slot report. (Found
    by review: before, the orphan check saw tm-1 registered under the attempt's session.)"""
    keys = log.keys
    world, _, t, _, _ = _a_long_running_job(log, tmp_path)
    b = jm(log, world, "jm-b", tmp_path, replay_page=1, serve_after_s=0.0)
    lead(b, world)
    assert b.recovering == ["big"]
    world.advance(6000)  # tm-1 silent past the heartbeat timeout (5 s)
    pump(
        [lambda: b.step(block_ms=None), b.step_lease],
        lambda: bool(events(log, keys.facts(keys.cluster), TaskManagerLost)),
        what="tm-1 lost",
        world=world,
        advance_ms=10,
        rounds=20,
    )
    assert b.recovering == ["big"]
    steps = [lambda: t.step(block_ms=None), lambda: b.step(block_ms=None), b.step_lease]
    pump(
        steps,
        lambda: len(events(log, keys.facts(keys.cluster), TaskManagerRegistered)) == 2,
        what="tm-1 registered again",
        world=world,
        advance_ms=10,
        rounds=50,
    )
    sessions = {r.session for r in events(log, keys.facts(keys.cluster), TaskManagerRegistered)}
    assert len(sessions) == 1  # registered again under the same session
    pump(steps, lambda: not b.recovering, what="big rebuilt", world=world, advance_ms=10, rounds=400)
    src = b.state.jobs.jobs["big"].vertices["src"].subtasks[0]
    assert src.state in (TaskState.CREATED, TaskState.SCHEDULED, TaskState.DEPLOYING) and src.attempt == 1, src
    failed = [
        f for f in events(log, keys.facts(keys.job("big")), UpdateTaskExecutionState) if f.state == TaskState.FAILED
    ]
    assert [f.execution_id for f in failed] == ["src:0:0"] and "was lost" in (failed[0].error or ""), failed
    assert b.errors == [] and _leader_view(b, "big") == _replayed(log, "big")
    b.job_inboxes.close_coordinators()


@pytest.mark.parametrize("serve_after_s", [None, 0.0], ids=["rebuilt-first", "rebuilt-while-serving"])
def test_a_loss_the_dead_leader_committed_fails_the_attempts_though_the_taskmanager_is_back(
    log: EventLog, tmp_path: Path, serve_after_s: float | None
) -> None:
    """Issue 28, finding 3: leader A commits ``TaskManagerLost`` for tm-1 and dies before
    failing ``big``'s attempt there; tm-1 then registers again with B under the same
    session. Whether B rebuilds ``big`` before serving or while it serves, the attempt
    fails (the registration it was placed on ended), as a live leader would have failed
    it. Before the fix, with a rebuild while serving, the join found tm-1 registered under
    the attempt's session and left the attempt RUNNING on a TaskManager that dropped it."""
    keys = log.keys

    def commits_the_loss_and_dies(a: Any) -> None:
        session = a.state.membership.taskmanagers["tm-1"].session
        a.cluster.commit_facts(
            [TaskManagerLost("tm-1", session, "no heartbeat for 6000 ms (timeout 5000 ms)")], consequences=False
        )  # the job's commit never came

    world, _, t, _, _ = _a_long_running_job(log, tmp_path, commits_the_loss_and_dies)
    b = jm(log, world, "jm-b", tmp_path, replay_page=1, serve_after_s=serve_after_s)
    lead(b, world)
    steps = [lambda: t.step(block_ms=None), lambda: b.step(block_ms=None), b.step_lease]
    registered = keys.facts(keys.cluster)
    pump(
        steps,
        lambda: len(events(log, registered, TaskManagerRegistered)) == 2,
        what="tm-1 registered again",
        world=world,
        advance_ms=10,
        rounds=50,
    )
    assert len({r.session for r in events(log, registered, TaskManagerRegistered)}) == 1  # the same session
    if serve_after_s is not None:
        assert b.recovering == ["big"], "big was rebuilt before tm-1 came back: make its log longer"
    pump(steps, lambda: not b.recovering, what="big rebuilt", world=world, advance_ms=10, rounds=400)
    failed = [
        f for f in events(log, keys.facts(keys.job("big")), UpdateTaskExecutionState) if f.state == TaskState.FAILED
    ]
    assert [f.execution_id for f in failed] == ["src:0:0"] and "was lost" in (failed[0].error or ""), failed
    src = b.state.jobs.jobs["big"].vertices["src"].subtasks[0]
    assert src.attempt == 1 and src.state != TaskState.RUNNING, src
    assert b.errors == [] and _leader_view(b, "big") == _replayed(log, "big")
    b.job_inboxes.close_coordinators()


def test_a_message_about_a_job_being_rebuilt_rebuilds_it_at_once(log: EventLog, tmp_path: Path) -> None:
    """``sluice job dispose`` of a job still being rebuilt: it is rebuilt then and there, and
    answered for what it is (running), not as a job the leader does not know."""
    keys = log.keys
    world, _, t, _, _ = _a_long_running_job(log, tmp_path)
    b = jm(log, world, "jm-b", tmp_path, replay_page=1, serve_after_s=0.0)
    lead(b, world)
    assert b.recovering == ["big"]
    reply = keys.inbox(keys.client("c9"))
    log.append(keys.inbox(keys.cluster), Envelope(DisposeJob("big", reply), world.new_id(), 0, world.now_ms()))
    pump(
        [lambda: b.step(block_ms=None)],
        lambda: bool(events(log, reply, JobRefused)),
        what="the answer",
        world=world,
        advance_ms=10,
        rounds=5,
    )
    (refused,) = events(log, reply, JobRefused)
    assert "is RUNNING" in refused.reason, refused.reason
    assert b.recovering == [] and b.replay is None and b.errors == []
    assert _leader_view(b, "big") == _replayed(log, "big")
    b.job_inboxes.close_coordinators()


def test_by_default_a_short_rebuild_ends_before_the_leader_serves(log: EventLog, tmp_path: Path) -> None:
    """With the default (serve after 1 s of rebuilding), a log that is quick to replay is
    rebuilt whole first: the leader serves every job from its first step as leader."""
    world, _, _, _, _ = _a_long_running_job(log, tmp_path)
    b = jm(log, world, "jm-b", tmp_path, replay_page=1)
    lead(b, world)
    assert b.recovering == [] and b.replay is None
    assert _leader_view(b, "big") == _replayed(log, "big")
    b.job_inboxes.close_coordinators()
