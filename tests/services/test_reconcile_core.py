"""Reconciliation, pure: slot reports against the leader's view (services/jobs/reconcile.py).

Every difference is acted on only once it has lasted two reports and the grace period
(reports and the attempts' own reports travel on different streams); then a lost final
state is accepted, a missing attempt fails and restarts, an unknown one is cancelled (a
finished one released), and a deployment no TaskManager took times out.
"""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.events import (
    AttemptReport,
    CancelTask,
    JobStatus,
    RestartStrategy,
    SubmitTask,
    TaskRestartScheduled,
    TaskState,
    UpdateTaskExecutionState,
)
from sluice.services.common.decision import Address, Decision, Recorded
from sluice.services.jobs.reconcile import DeploymentTimeouts, LostFinals, SlotReport
from sluice.services.jobs.slot_memory import Memory
from tests.cores import CFG, JobsDriven
from tests.services.test_jobs_core import wordcount

GRACE = 5_000


def seen(out: Decision) -> SimpleNamespace:
    """What a slot report's decision says, by kind: the job decisions, the cancels and the
    releases sent to the TaskManager, and the final states it may forget."""
    sent = [m for _, m in out.sends]
    return SimpleNamespace(
        decisions=out.jobs,
        cancels=[m for m in sent if isinstance(m, CancelTask)],
        release=[m for m in sent if isinstance(m, UpdateTaskExecutionState)],
        recorded=[t for r in out.of(Recorded) for t in r.task_ids],
    )


def started(sim: JobsDriven) -> list[SubmitTask]:
    """Two source subtasks deployed (one on each TaskManager) and RUNNING."""
    tasks = sim.schedule()
    for t in tasks:
        sim.report(t, TaskState.RUNNING)
    return tasks


def where(sim: JobsDriven, t: SubmitTask) -> str:
    tm = sim.job.vertices[t.vertex_id].subtasks[t.subtask].taskmanager
    assert tm is not None
    return tm


def line(t: SubmitTask, state: TaskState, error: str | None = None) -> AttemptReport:
    return AttemptReport("j1", t.execution_id, state, error)


def run(sim: JobsDriven, memory: Memory, tm: str, report: list[AttemptReport], *, caught_up: bool = True):
    """One read of the leader's inboxes (``caught_up``: to the end of the cluster inbox) that
    brought this report."""
    memory.read(caught_up)
    memory.reading = True
    try:
        out = sim.tell(SlotReport(memory, tm, "s", report, GRACE, CFG))
    finally:
        memory.reading = False
    return seen(out)


def test_a_consistent_report_changes_nothing_however_often_it_comes() -> None:
    sim = JobsDriven(wordcount(), {"tm-a": 1, "tm-b": 1})
    tasks = started(sim)
    memory = Memory()
    for _ in range(5):
        for t in tasks:
            out = run(sim, memory, where(sim, t), [line(t, TaskState.RUNNING)])
            assert (out.decisions, out.cancels, out.release, out.recorded) == ([], [], [], [])
        sim.now += GRACE
    assert sim.job.status == JobStatus.RUNNING


def next_read(sim: JobsDriven, memory: Memory, *, job_caught_up: bool) -> list:
    """The leader's next read of its inboxes (``job_caught_up``: it read the job's inbox to
    its end), its messages handled: lost final states are judged."""
    memory.read(True)
    return sim.tell(LostFinals(memory, lambda job_id: job_caught_up, CFG)).jobs


def test_a_lost_final_state_is_taken_once_the_jobs_inbox_was_read_to_its_end_after_the_report() -> None:
    """The worker's own report goes to the job's inbox before its TaskManager lists the final
    state: a read of that inbox to its end after the slot report, with the attempt still
    running, proves the report lost (not late)."""
    sim = JobsDriven(wordcount(), {"tm-a": 1, "tm-b": 1})
    t, _ = started(sim)
    tm, memory = where(sim, t), Memory()
    failed = [line(t, TaskState.FAILED, "ValueError: bad row 7")]
    out = run(sim, memory, tm, failed)
    assert (out.decisions, out.recorded) == ([], [])
    for _ in range(3):  # the job's inbox is behind: its report may be on the way, however long it takes
        sim.now += GRACE
        assert next_read(sim, memory, job_caught_up=False) == []
    facts = [f for d in next_read(sim, memory, job_caught_up=True) for f in d.facts]
    assert isinstance(facts[0], UpdateTaskExecutionState) and facts[0].state == TaskState.FAILED
    assert facts[0].error == "ValueError: bad row 7"
    assert any(isinstance(f, TaskRestartScheduled) for f in facts)  # restarted as any failure is
    assert memory.accepted == [f"j1/{t.execution_id}"]
    # Now the log has it: the next report's line is confirmed, so the TaskManager forgets it.
    assert run(sim, memory, tm, failed).recorded == [f"j1/{t.execution_id}"]
    assert sim.replays_to_live()


def test_a_final_state_in_the_same_read_as_its_report_is_not_taken() -> None:
    """Judged only on a read after the one that brought the slot report: the job's messages
    of that read (the report itself among them) are handled after the cluster's."""
    sim = JobsDriven(wordcount(), {"tm-a": 1, "tm-b": 1})
    t, _ = started(sim)
    tm, memory = where(sim, t), Memory()
    run(sim, memory, tm, [line(t, TaskState.FINISHED)])
    assert sim.tell(LostFinals(memory, lambda job_id: True, CFG)).jobs == []
    sim.report(t, TaskState.FINISHED)  # the report arrives in that read after all
    assert next_read(sim, memory, job_caught_up=True) == [] and memory.finals == {}


def test_a_lost_finished_report_finishes_the_subtask_with_its_partition() -> None:
    sim = JobsDriven(wordcount(), {"tm-a": 1, "tm-b": 1})
    t, _ = started(sim)
    tm, memory = where(sim, t), Memory()
    run(sim, memory, tm, [line(t, TaskState.FINISHED)])
    next_read(sim, memory, job_caught_up=True)
    ex = sim.job.vertices[t.vertex_id].subtasks[t.subtask]
    assert ex.state == TaskState.FINISHED and ex.produced  # consumers do not wait for a lost "produced"
    assert sim.job.restarts == 0


def test_an_attempt_its_taskmanager_no_longer_holds_fails_and_restarts() -> None:
    sim = JobsDriven(wordcount(), {"tm-a": 1, "tm-b": 1})
    t, other = started(sim)
    tm, memory = where(sim, t), Memory()
    assert run(sim, memory, tm, []).decisions == []  # the leader's first read: no report yet counts
    assert run(sim, memory, tm, []).decisions == []  # missing, seen once
    sim.now += GRACE
    out = run(sim, memory, tm, [])
    (fact, restart) = [f for d in out.decisions for f in d.facts][:2]
    assert fact.state == TaskState.FAILED and "no longer holds it" in (fact.error or "")
    assert isinstance(restart, TaskRestartScheduled) and restart.attempt == t.attempt + 1
    # The other TaskManager's attempt is not touched by this one's report.
    assert sim.job.vertices[other.vertex_id].subtasks[other.subtask].state == TaskState.RUNNING


def test_a_backlog_of_reports_older_than_the_attempt_never_fails_it() -> None:
    """The leader heard of the attempt (its RUNNING) in a read that did not reach the end of
    the cluster inbox: every report read since may predate it, however many and however
    late. Only a report read after a read that reached the end counts."""
    sim = JobsDriven(wordcount(), {"tm-a": 1, "tm-b": 1})
    t, _ = started(sim)
    tm, memory = where(sim, t), Memory()
    memory.read(False)
    memory.heard(f"j1/{t.execution_id}")
    for _ in range(5):
        sim.now += GRACE
        assert run(sim, memory, tm, [], caught_up=False).decisions == []
    assert run(sim, memory, tm, []).decisions == []  # this read reaches the end: later ones count
    sim.now += GRACE
    assert run(sim, memory, tm, []).decisions == []  # first report that counts
    sim.now += GRACE
    assert run(sim, memory, tm, []).decisions != []


def test_reclaimed_reports_are_no_evidence() -> None:
    sim = JobsDriven(wordcount(), {"tm-a": 1, "tm-b": 1})
    t, _ = started(sim)
    tm, memory = where(sim, t), Memory()
    for _ in range(4):
        memory.read(True)  # not ``reading``: entries another consumer left pending, of any age
        assert sim.tell(SlotReport(memory, tm, "s", [], GRACE, CFG)).jobs == []
        sim.now += GRACE


def test_a_difference_that_goes_away_starts_over() -> None:
    sim = JobsDriven(wordcount(), {"tm-a": 1, "tm-b": 1})
    t, _ = started(sim)
    tm, memory = where(sim, t), Memory()
    run(sim, memory, tm, [])  # an old report, overtaken
    sim.now += GRACE
    run(sim, memory, tm, [line(t, TaskState.RUNNING)])
    sim.now += GRACE
    assert run(sim, memory, tm, []).decisions == []  # one report only since it went missing
    assert sim.job.vertices[t.vertex_id].subtasks[t.subtask].state == TaskState.RUNNING


def test_an_attempt_the_leader_does_not_count_is_cancelled_once_per_grace_period() -> None:
    sim = JobsDriven(wordcount(), {"tm-a": 1, "tm-b": 1})
    t, _ = started(sim)
    tm, memory = where(sim, t), Memory()
    stale = AttemptReport("j1", t.execution_id.rsplit(":", 1)[0] + ":7", TaskState.RUNNING)  # a newer attempt
    gone = AttemptReport("no-such-job", "v:0:0", TaskState.RUNNING)
    report = [line(t, TaskState.RUNNING), stale, gone]
    assert run(sim, memory, tm, report).cancels == []
    sim.now += GRACE
    out = run(sim, memory, tm, report)
    assert sorted((c.job_id, c.execution_id) for c in out.cancels) == sorted(
        [("j1", stale.execution_id), ("no-such-job", "v:0:0")]
    )
    assert "its job is not running" in next(c for c in out.cancels if c.job_id == "no-such-job").reason
    sim.now += 1
    assert run(sim, memory, tm, report).cancels == []  # sent already; again only after the grace period
    sim.now += GRACE
    assert len(run(sim, memory, tm, report).cancels) == 2
    assert sim.job.status == JobStatus.RUNNING and sim.job.restarts == 0


def test_a_finished_attempt_still_held_is_released_not_cancelled() -> None:
    """A cancel would delete the output the consumers read."""
    sim = JobsDriven(wordcount(), {"tm-a": 1, "tm-b": 1})
    t, _ = started(sim)
    sim.produce(t)
    sim.report(t, TaskState.FINISHED)
    tm, memory = where(sim, t), Memory()
    for _ in range(2):
        out = run(sim, memory, tm, [line(t, TaskState.RUNNING)])
        sim.now += GRACE
    assert out.cancels == [] and [(r.execution_id, r.state, r.taskmanager) for r in out.release] == [
        (t.execution_id, TaskState.FINISHED, None)
    ]


def deployed(sim: JobsDriven, memory: Memory, *, caught_up: bool = True) -> list[SubmitTask]:
    """Both sources deployed (DEPLOYING), in the leader's current read."""
    tasks = sim.schedule()
    memory.read(caught_up)
    for t in tasks:
        memory.heard(f"j1/{t.execution_id}")
    return tasks


def test_a_deployment_no_taskmanager_took_times_out_and_restarts() -> None:
    sim = JobsDriven(wordcount(RestartStrategy("fixed-delay", 2, 0)), {"tm-a": 1, "tm-b": 1})
    memory = Memory(leading_since=sim.now)
    a, b = deployed(sim, memory)
    tm_a, tm_b = where(sim, a), where(sim, b)
    for _ in range(3):
        run(sim, memory, tm_b, [line(b, TaskState.DEPLOYING)])  # b's TaskManager has it
        run(sim, memory, tm_a, [])  # a's never got it
        sim.now += 20_000
    assert sim.tell(DeploymentTimeouts(memory, 60_000, CFG)).jobs == []
    sim.now += 1
    (d,) = sim.tell(DeploymentTimeouts(memory, 60_000, CFG)).jobs
    assert d.facts[0].execution_id == a.execution_id and "not acknowledged within 60 s" in (d.facts[0].error or "")
    assert [(dest, type(m), m.execution_id) for dest, m in d.sends] == [
        (Address.taskmanager(tm_a), CancelTask, a.execution_id)
    ]
    assert sim.job.vertices[b.vertex_id].subtasks[b.subtask].state == TaskState.DEPLOYING
    assert sim.job.vertices[a.vertex_id].subtasks[a.subtask].attempt == a.attempt + 1


def test_a_deployment_is_timed_out_only_on_reports_sent_after_it() -> None:
    """Reports read while the cluster inbox has stayed behind since the deployment may
    predate it, however late they are read (a backlog of heartbeats and registration
    retries): they say nothing. Only reports read after a read that reached the end count."""
    sim = JobsDriven(wordcount(RestartStrategy("fixed-delay", 2, 0)), {"tm-a": 1, "tm-b": 1})
    memory = Memory(leading_since=sim.now)
    a, _ = deployed(sim, memory, caught_up=False)
    tm = where(sim, a)
    for _ in range(4):
        sim.now += 30_000
        run(sim, memory, tm, [], caught_up=False)  # old reports, read late
    assert sim.tell(DeploymentTimeouts(memory, 60_000, CFG)).jobs == []
    for caught_up in (True, False, False):  # the backlog is read to its end: what comes after counts
        run(sim, memory, tm, [], caught_up=caught_up)
    assert len(sim.tell(DeploymentTimeouts(memory, 60_000, CFG)).jobs) == 1


def test_a_deployment_its_taskmanager_reports_ended_is_answered() -> None:
    """A task that ends between two heartbeats is never listed as held, only as a final
    state (always so on a TaskManager that does not execute): that answers the deployment."""
    sim = JobsDriven(wordcount(RestartStrategy("fixed-delay", 2, 0)), {"tm-a": 1, "tm-b": 1})
    memory = Memory(leading_since=sim.now)
    a, _ = deployed(sim, memory)
    tm = where(sim, a)
    for _ in range(3):
        run(sim, memory, tm, [line(a, TaskState.FINISHED)])
        sim.now += 3_000
    assert sim.tell(DeploymentTimeouts(memory, 5_000, CFG)).jobs == []


def test_a_new_leader_gives_deployments_a_full_timeout() -> None:
    sim = JobsDriven(wordcount(), {"tm-a": 1, "tm-b": 1})
    sim.schedule()
    sim.now += 120_000
    assert sim.tell(DeploymentTimeouts(Memory(leading_since=sim.now - 1_000), 60_000, CFG)).jobs == []


_KINDS = st.sampled_from(["held", "missing", "finished", "failed", "stale", "unknown-job"])


@settings(max_examples=80, deadline=None)
@given(
    kinds=st.lists(st.tuples(st.integers(0, 1), _KINDS), min_size=1, max_size=12),
    gaps=st.lists(st.integers(0, 2 * GRACE), min_size=12, max_size=12),
)
def test_whatever_the_reports_the_facts_replay_to_the_live_state(kinds, gaps) -> None:
    """Reports of any shape, at any pace: the state stays a fold of the recorded facts;
    a TaskManager's first report, or one within the grace period of its first, never
    causes anything; and an attempt a report shows as held is never failed or cancelled."""
    sim = JobsDriven(wordcount(), {"tm-a": 1, "tm-b": 1})
    tasks = started(sim)
    placed = [where(sim, t) for t in tasks]
    memory = Memory()
    first: dict[str, int] = {}
    for (which, kind), gap in zip(kinds, gaps):
        t, tm = tasks[which], placed[which]
        report = {
            "held": [line(t, TaskState.RUNNING)],
            "missing": [],
            "finished": [line(t, TaskState.FINISHED)],
            "failed": [line(t, TaskState.FAILED, "boom")],
            "stale": [AttemptReport("j1", t.execution_id.rsplit(":", 1)[0] + ":9", TaskState.RUNNING)],
            "unknown-job": [AttemptReport("other", "v:0:0", TaskState.RUNNING)],
        }[kind]
        first.setdefault(tm, sim.now)
        current = sim.job.vertices[t.vertex_id].subtasks[t.subtask]
        running = current.attempt == t.attempt and not current.state.terminal
        out = run(sim, memory, tm, report)
        if out.decisions or out.cancels or out.release:
            assert sim.now - first[tm] >= GRACE
        if kind == "held" and running:
            assert out.decisions == [] and out.cancels == []
        sim.now += gap
    assert sim.replays_to_live()


def test_a_lost_finished_report_without_its_queryable_state_registration_runs_the_attempt_again() -> None:
    """Found by the simulation: Redis lost a keyed task's last writes (its registration and
    its FINISHED), its TaskManager's slot report still listed it FINISHED, and the job
    finished with 6 of 8 key groups registered. Now the attempt runs again, as a failed one
    does; one whose registration is in the log finishes from the slot report as before."""
    from tests.services.test_kvstate_core import reg, running

    sim, (lost, kept) = running()
    sim.tell(reg(kept))
    memory = Memory()
    for t in (lost, kept):
        run(sim, memory, where(sim, t), [line(t, TaskState.FINISHED)])
    facts = [f for d in next_read(sim, memory, job_caught_up=True) for f in d.facts]
    states = {f.execution_id: f for f in facts if isinstance(f, UpdateTaskExecutionState)}
    assert states[kept.execution_id].state == TaskState.FINISHED
    assert states[lost.execution_id].state == TaskState.FAILED
    assert "queryable state's registration was lost" in (states[lost.execution_id].error or "")
    assert any(
        isinstance(f, TaskRestartScheduled) and (f.vertex_id, f.subtask) == (lost.vertex_id, lost.subtask)
        for f in facts
    )
    assert sim.job.status == JobStatus.RUNNING
