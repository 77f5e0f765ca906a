"""Reconciliation's cheap paths decide exactly as the full scans they replaced
(services/jobs/reconcile.py, services/jobs/state.py): the slot walk that skips reported
attempts first, deployment timeouts that look only at unanswered deployments, lost finals
looked at only once some job with finals was read to its end, the slot
pool's index of placed attempts, and the cache behind ``JobRun.current``.

The scans as they were (before 2 x 10,000 subtasks made them a quarter of the leader's
time) are kept below as the reference; random histories drive both side by side."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.events import (
    AttemptReport,
    CancelTask,
    RestartStrategy,
    ScheduleOrUpdateConsumers,
    TaskRestartScheduled,
    TaskState,
    UpdateTaskExecutionState,
)
from sluice.services.common.decision import Address, Decision, Note, Recorded, Send
from sluice.services.jobs.core import JobsConfig, _update
from sluice.services.jobs.failures import fail, gone, maybe_complete
from sluice.services.jobs.machine import REPORTED
from sluice.services.jobs.reconcile import _WATCHED, DeploymentTimeouts, LostFinals, SlotReport
from sluice.services.jobs.recorder import Recorder
from sluice.services.jobs.slot_memory import Memory, PerTaskManager, Seen
from sluice.services.jobs.state import TERMINAL_JOB, Execution, JobRun, JobsState, SlotPool, parse_execution_id
from tests.cores import CFG, JobsDriven
from tests.services.test_jobs_core import wordcount

GRACE = 5_000
TIMEOUT = 12_000
TMS = ("tm-a", "tm-b")


class Side(JobsDriven):
    """One side: the jobs core driven as the shell does (the fixture), with the leader's report
    memory; ``reference``: reconciliation decided by the full scans below."""

    def __init__(self, reference: bool) -> None:
        super().__init__(wordcount(RestartStrategy("fixed-delay", 3, 0), sources=3, reducers=3), {tm: 3 for tm in TMS})
        self.memory = Memory(leading_since=self.now)
        if reference:
            self.reconcile_door = _reference_decide

    def reconcile(self, tm: str, session: str, report: list[AttemptReport], caught_up: bool) -> Decision:
        self.memory.read(caught_up)
        self.memory.reading = True
        try:
            return self.tell(SlotReport(self.memory, tm, session, report, GRACE, CFG))
        finally:
            self.memory.reading = False

    def timeouts(self) -> list[Decision]:
        return self.tell(DeploymentTimeouts(self.memory, TIMEOUT, CFG)).jobs

    def lost_finals(self, caught_up: bool) -> list[Decision]:
        self.memory.read(True)
        return self.tell(LostFinals(self.memory, lambda job_id: caught_up, CFG)).jobs

    def tell(self, stimulus):
        if isinstance(stimulus, UpdateTaskExecutionState):
            self.memory.heard(f"j1/{stimulus.execution_id}")
        return super().tell(stimulus)

    def deploy(self, sessions: bool) -> None:
        names = {tm: "s" for tm in TMS} if sessions else None
        for task in self.schedule(names):  # as the shell does once the deployment is committed
            self.memory.heard(f"j1/{task.execution_id}")

    def same_as(self, other: Side) -> None:
        a, b = self.memory, other.memory
        assert self.state == other.state
        assert self.log == other.log and self.sent == other.sent
        assert (a.taskmanagers, a.finals, a.accepted, a.batch, a.fresh) == (
            b.taskmanagers,
            b.finals,
            b.accepted,
            b.batch,
            b.fresh,
        )
        # What was heard of attempts no longer placed is forgotten at a slightly different
        # moment (it no longer matters: an attempt that left the pool never comes back).
        for tm, task_ids in a.finals_on.items():  # the index of finals by TaskManager is theirs
            assert task_ids == {t for t, f in a.finals.items() if f[1] == tm}
        assert {f[1] for f in a.finals.values()} <= set(a.finals_on)
        assert a.final_jobs == Counter(t.partition("/")[0] for t in a.finals)
        placed = {f"{j}/{e}" for held in self.state.pool.used.values() for j, e in held}
        assert {t: n for t, n in a.heard_at.items() if t in placed} == {
            t: n for t, n in b.heard_at.items() if t in placed
        }


def _executions(sim: JobsDriven) -> list[Execution]:
    return list(sim.job.executions())


_LINE_STATES = [
    None,
    None,
    TaskState.DEPLOYING,
    TaskState.RUNNING,
    TaskState.RUNNING,
    TaskState.FINISHED,
    TaskState.FAILED,
    TaskState.CANCELED,
]


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_cheap_paths_decide_as_the_full_scans(data) -> None:
    new, ref = Side(False), Side(True)
    for _ in range(data.draw(st.integers(5, 40), label="steps")):
        step = data.draw(
            st.sampled_from(
                ["schedule", "move", "report", "report", "report", "time", "timeouts", "finals", "read", "heard"]
            ),
            label="step",
        )
        exs = _executions(new)
        if step == "schedule":
            sessions = data.draw(st.booleans(), label="sessions")
            for w in (new, ref):
                w.deploy(sessions)
        elif step == "move":
            ex = data.draw(st.sampled_from(exs), label="subtask")
            moves = [to for (old, to) in REPORTED if old == ex.state]
            if (
                ex.state in (TaskState.RUNNING, TaskState.FINISHED)
                and not ex.produced
                and new.job.vertices[ex.vertex].outputs
            ):
                moves.append("produced")
            if not moves:
                continue
            to = data.draw(st.sampled_from(sorted(moves, key=str)), label="to")
            if to == "produced":
                message = ScheduleOrUpdateConsumers("j1", ex.id, ex.vertex, ex.subtask, ex.attempt)
            else:
                message = UpdateTaskExecutionState("j1", ex.id, to, "boom" if to == TaskState.FAILED else None)
            for w in (new, ref):
                w.tell(message)
        elif step == "report":
            tm = data.draw(st.sampled_from(TMS), label="tm")
            report = []
            for ex in exs:
                if ex.taskmanager == tm or data.draw(st.integers(0, 9), label="elsewhere") == 0:
                    state = data.draw(st.sampled_from(_LINE_STATES), label="line")
                    if state is not None:
                        report.append(AttemptReport("j1", ex.id, state, "x" if state == TaskState.FAILED else None))
                    if data.draw(st.integers(0, 9), label="stale") == 0:
                        old = f"{ex.vertex}:{ex.subtask}:{max(ex.attempt - 1, 0)}"
                        report.append(AttemptReport("j1", old, TaskState.RUNNING))
            if data.draw(st.integers(0, 5), label="unknown") == 0:
                report.append(AttemptReport("other", "v:0:0", TaskState.RUNNING))
            order = data.draw(st.permutations(report), label="order")
            session = data.draw(st.sampled_from(["s", "s", "old"]), label="session")
            caught_up = data.draw(st.booleans(), label="caught_up")
            outs = [w.reconcile(tm, session, list(order), caught_up) for w in (new, ref)]
            assert outs[0] == outs[1]
        elif step == "time":
            gap = data.draw(st.sampled_from([0, 1, 1_000, GRACE, GRACE + 1, TIMEOUT, 30_000]), label="gap")
            for w in (new, ref):
                w.now += gap
        elif step == "timeouts":
            assert new.timeouts() == ref.timeouts()
        elif step == "finals":
            caught_up = data.draw(st.booleans(), label="job caught up")
            assert new.lost_finals(caught_up) == ref.lost_finals(caught_up)
        elif step == "read":
            caught_up = data.draw(st.booleans(), label="caught_up")
            for w in (new, ref):
                w.memory.read(caught_up)
        else:
            ex = data.draw(st.sampled_from(exs), label="heard of")
            for w in (new, ref):
                w.memory.heard(f"j1/{ex.id}")
        new.same_as(ref)


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.booleans(),
            st.sampled_from(TMS),
            st.integers(0, 2),
            st.sampled_from(["j", "k"]),
            st.sampled_from(["v:0:0", "v:0:1", "v:1:0"]),
        ),
        max_size=40,
    )
)
def test_the_pools_index_of_placed_attempts_is_its_holders_counted(ops) -> None:
    pool = SlotPool()
    for take, tm, slot, job, eid in ops:
        if take:
            pool.take(tm, slot, job, eid)
        else:
            pool.give_back(tm, slot, job, eid)
        assert pool.placed == Counter(f"{j}/{e}" for held in pool.used.values() for j, e in held)


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(st.tuples(st.booleans(), st.integers(0, 3), st.integers(0, 3)), max_size=30),
    asked=st.lists(
        st.sampled_from(
            [
                "lines -> tokenize:0:0",
                "lines -> tokenize:0:1",
                "lines -> tokenize:1:2",
                "count -> out:1:0",
                "count -> out:01:0",
                "count -> out:-1:0",
                "nope:0:0",
                "count -> out:5:0",
                "garbage",
            ]
        ),
        min_size=1,
        max_size=9,
    ),
)
def test_the_current_attempt_cache_answers_as_parsing_does(steps, asked) -> None:
    """Asked again and again as attempts restart (and the graph is built anew)."""
    sim = JobsDriven(wordcount(RestartStrategy("fixed-delay", 9, 0)), {"tm-a": 4})
    job = sim.job
    for restart, which, attempt in steps:
        ex = _executions(sim)[which]
        if restart and ex.state == TaskState.CREATED and attempt > ex.attempt:
            sim.commit(TaskRestartScheduled("j1", ex.vertex, ex.subtask, attempt, 1, 0))
        for eid in asked:
            assert job.current(eid) is _uncached_current(job, eid)


def test_both_sides_time_out_a_deployment_and_fail_a_missing_attempt() -> None:
    """The histories the law is checked on do reach decisions: here, by hand, one of each."""
    new, ref = Side(False), Side(True)
    for w in (new, ref):
        w.deploy(False)
    a, b = _executions(new)[:2]
    assert a.taskmanager is not None and b.taskmanager is not None and a.taskmanager != b.taskmanager
    a_id, b_id = a.id, b.id  # (the executions move on to their next attempts)
    running = UpdateTaskExecutionState("j1", b_id, TaskState.RUNNING, None)
    for w in (new, ref):
        w.tell(running)
    for _ in range(3):
        for tm in (a.taskmanager, b.taskmanager):  # neither lists its attempt
            assert new.reconcile(tm, "s", [], True) == ref.reconcile(tm, "s", [], True)
        for w in (new, ref):
            w.now += TIMEOUT
    failed = [f for d in new.timeouts() for f in d.facts]
    assert failed and failed[0].execution_id == a_id and failed[0].state == TaskState.FAILED
    assert [f for d in ref.timeouts() for f in d.facts] == failed
    assert any(
        isinstance(f, UpdateTaskExecutionState) and f.execution_id == b_id and f.state == TaskState.FAILED
        for f in new.log
    )  # missing: failed on the reports
    new.same_as(ref)


# --- the reference: the scans as they were --------------------------------------------------


def _uncached_current(job: JobRun, eid: str) -> Execution | None:
    try:
        vertex, subtask, attempt = parse_execution_id(eid)
        if subtask < 0:
            return None
        ex = job.vertices[vertex].subtasks[subtask]
    except (ValueError, KeyError, IndexError):
        return None
    return ex if ex.attempt == attempt and ex.id == eid else None


def _split(task_id: str) -> tuple[str, str]:
    job_id, _, execution_id = task_id.partition("/")
    return job_id, execution_id


def _reference_reconcile(
    state: JobsState,
    memory: Memory,
    resource_id: str,
    session: str,
    report: list[AttemptReport],
    now: int,
    grace_ms: int,
    config: JobsConfig,
) -> Decision:
    out = SimpleNamespace(cancels=[], release=[], recorded=[], notes=[])
    tm = memory.taskmanagers.setdefault(resource_id, PerTaskManager())
    previous, tm.differences = tm.differences, {}
    held = {r.task_id: r for r in report if not r.state.terminal}
    finals = {r.task_id: r for r in report if r.state.terminal}
    recorders: dict[str, Recorder] = {}

    def due(kind: str, task_id: str) -> bool:
        seen = previous.get((kind, task_id))
        seen = Seen(seen.since, seen.reports + 1) if seen is not None else Seen(now)
        tm.differences[(kind, task_id)] = seen
        return seen.reports >= 2 and now - seen.since >= grace_ms

    def cancel_due(task_id: str) -> bool:
        last = tm.cancelled.get(task_id)
        if last is not None and now - last < grace_ms:
            return False
        tm.cancelled[task_id] = now
        return True

    def recorder(job_id: str) -> Recorder:
        if job_id not in recorders:
            recorders[job_id] = Recorder(state, job_id, now)
        return recorders[job_id]

    for slot in sorted(state.pool.by_taskmanager.get(resource_id, ())):
        for job_id, eid in sorted(state.pool.used.get((resource_id, slot), ())):
            job = state.jobs.get(job_id)
            ex = _uncached_current(job, eid) if job is not None and job.status not in TERMINAL_JOB else None
            if job is None or ex is None or ex.taskmanager != resource_id:
                continue
            if ex.session is not None and ex.session != session:
                continue
            task_id = f"{job_id}/{eid}"
            kind = "deploying" if ex.state == TaskState.DEPLOYING else "missing" if ex.state in _WATCHED else None
            if kind is None or task_id in held or task_id in finals:
                continue
            if not memory.evidence(task_id):
                if (kind, task_id) in previous:
                    tm.differences[(kind, task_id)] = previous[(kind, task_id)]
                continue
            if not due(kind, task_id) or kind == "deploying":
                continue
            rec = recorder(job_id)
            gone(
                rec,
                job,
                ex,
                f"TaskManager {resource_id} no longer holds it and never reported its end "
                "(its slot report does not list it)",
                config,
            )
            maybe_complete(rec, job)
            out.notes.append(f"{task_id} missing on {resource_id}: failed")

    for task_id in [t for t, (_, rid, _) in memory.finals.items() if rid == resource_id and t not in finals]:
        del memory.finals[task_id]
    for task_id, line in finals.items():
        job_id, execution_id = _split(task_id)
        found = state.jobs.get(job_id)
        ex = _uncached_current(found, execution_id) if found is not None else None
        if (
            found is None
            or found.status in TERMINAL_JOB
            or ex is None
            or ex.state.terminal
            or ex.taskmanager != resource_id
        ):
            out.recorded.append(task_id)
            memory.finals.pop(task_id, None)
            continue
        memory.finals.setdefault(task_id, (memory.batch, resource_id, line))

    for task_id in held:
        job_id, execution_id = _split(task_id)
        found = state.jobs.get(job_id)
        ex = _uncached_current(found, execution_id) if found is not None else None
        if ex is not None and ex.taskmanager == resource_id and ex.state == TaskState.CANCELING:
            if due("cancelling", task_id) and cancel_due(task_id):
                out.cancels.append(
                    CancelTask(job_id, execution_id, "cancelled (said again: the TaskManager still holds it)")
                )
            continue
        if ex is not None and ex.taskmanager == resource_id and not ex.state.terminal:
            continue
        if ex is not None and ex.taskmanager == resource_id and ex.state == TaskState.FINISHED:
            if due("finished", task_id):
                out.release.append(
                    UpdateTaskExecutionState(
                        job_id, execution_id, TaskState.FINISHED, None, ex.vertex, ex.subtask, ex.attempt, None, ex.slot
                    )
                )
            continue
        if not due("unknown", task_id) or not cancel_due(task_id):
            continue
        why = (
            "its job is not running"
            if found is None or found.status in TERMINAL_JOB
            else "the leader does not count this attempt (it failed, was cancelled, or was replaced)"
        )
        out.cancels.append(CancelTask(job_id, execution_id, f"reconciled with the slot report of {resource_id}: {why}"))
        out.notes.append(f"{task_id} unknown on {resource_id}: cancelled")
    tm.cancelled = {t: at for t, at in tm.cancelled.items() if t in held}
    return Decision(
        sends=[Send(Address.taskmanager(resource_id), m) for m in (*out.cancels, *out.release)],
        instructions=[*(Note(n) for n in out.notes), *([Recorded(tuple(out.recorded))] if out.recorded else [])],
        now=now,
        jobs=[rec.decision for rec in recorders.values() if rec.decision],
    )


def _reference_timeouts(
    state: JobsState, memory: Memory, now: int, timeout_ms: int, config: JobsConfig
) -> list[Decision]:
    out: dict[str, Recorder] = {}
    placed: set[str] = set()
    for (tm, _slot), holders in sorted(state.pool.used.items()):
        for job_id, eid in sorted(holders):
            task_id = f"{job_id}/{eid}"
            placed.add(task_id)
            job = state.jobs.get(job_id)
            ex = _uncached_current(job, eid) if job is not None and job.status not in TERMINAL_JOB else None
            if job is None or ex is None or ex.state != TaskState.DEPLOYING or ex.taskmanager != tm:
                continue
            waited = now - max(ex.since, memory.leading_since)
            if waited <= timeout_ms or not memory.unanswered(tm, task_id):
                continue
            rec = out.setdefault(job_id, Recorder(state, job_id, now))
            rec.send(Address.taskmanager(tm), CancelTask(job_id, eid, "deployment timed out"))
            fail(
                rec,
                job,
                ex,
                f"deployment to TaskManager {tm} not acknowledged within {timeout_ms // 1000} s "
                "(its SubmitTask or the answer was lost)",
                config,
            )
            maybe_complete(rec, job)
    memory.keep(placed)
    return [rec.decision for rec in out.values() if rec.decision]


def _reference_lost_finals(
    state: JobsState, memory: Memory, caught_up: Callable[[str], bool], now: int, config: JobsConfig
) -> list[Decision]:
    out: dict[str, Recorder] = {}
    notes = []
    ready: dict[str, bool] = {}
    for task_id, (seen_in, resource_id, line) in list(memory.finals.items()):
        if seen_in >= memory.batch:
            continue
        job_id, execution_id = _split(task_id)
        if job_id not in ready:
            ready[job_id] = caught_up(job_id)
        if not ready[job_id]:
            # Looked at (or forgotten, if its attempt ended meanwhile) once caught up: a leader
            # behind on a busy job's inbox does not re-examine every final of it each step.
            continue
        job = state.jobs.get(job_id)
        ex = _uncached_current(job, execution_id) if job is not None and job.status not in TERMINAL_JOB else None
        del memory.finals[task_id]
        if job is None or ex is None or ex.state.terminal or ex.taskmanager != resource_id:
            continue
        rec = out.setdefault(job_id, Recorder(state, job_id, now))
        if line.state == TaskState.FINISHED and job.vertices[ex.vertex].outputs and not ex.produced:
            # A finished producer wrote its partition (its worker says so before it finishes):
            # that report was lost too, and consumers wait for it.
            rec.fact(ScheduleOrUpdateConsumers(job_id, ex.id, ex.vertex, ex.subtask, ex.attempt))
        _update(
            rec,
            job,
            UpdateTaskExecutionState(
                job_id, execution_id, line.state, line.error, ex.vertex, ex.subtask, ex.attempt, resource_id, ex.slot
            ),
            config,
        )
        notes.append(task_id)
    memory.accepted += notes
    return [rec.decision for rec in out.values() if rec.decision]


def _reference_decide(state: JobsState, s: SlotReport | LostFinals | DeploymentTimeouts, now: int) -> Decision:
    """Reconciliation's door, on the reference scans."""
    if isinstance(s, SlotReport):
        return _reference_reconcile(state, s.memory, s.resource_id, s.session, s.report, now, s.grace_ms, s.config)
    if isinstance(s, LostFinals):
        return Decision(now=now, jobs=_reference_lost_finals(state, s.memory, s.caught_up, now, s.config))
    return Decision(now=now, jobs=_reference_timeouts(state, s.memory, now, s.timeout_ms, s.config))
