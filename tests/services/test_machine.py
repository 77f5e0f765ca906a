"""The state machine of tasks and jobs (services/jobs/machine.py): the table's laws, its
groups of states, the story an illegal move is told with, and the one door ``evolve``
keeps (one handler per fact, none for anything else)."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import HealthCheck, settings

from sluice.errors import IllegalTransition
from sluice.events import (
    Envelope,
    Event,
    ExecutionGraphBuilt,
    JobGraph,
    JobStatus,
    JobStatusChanged,
    JobSubmitted,
    JobVertex,
    SourceSpec,
    SubmitJob,
    SubmitTask,
    TaskManagerLost,
    TaskRestartScheduled,
    TaskState,
    UpdateTaskExecutionState,
)
from sluice.services.jobs import core, machine
from sluice.services.jobs.machine import (
    ABORTED_JOB,
    ABORTED_TASK,
    HOLDS_SLOT,
    JOB_MOVES,
    LIVE_JOB,
    LIVE_TASK,
    REPORTED,
    STARTED_TASK,
    STOPPING_JOB,
    STOPPING_TASK,
    TASK_MOVES,
    TERMINAL_JOB,
    TERMINAL_TASK,
    UNDEPLOYED_TASK,
    Move,
)
from sluice.services.jobs.state import JobsState, evolve
from sluice.services.kvstate import registry as kvreg
from tests.services.test_jobs_model import EXAMPLES, JobsMachine

C, SC, DE, IN, RU, FI, CI, CA, FA = (
    TaskState.CREATED,
    TaskState.SCHEDULED,
    TaskState.DEPLOYING,
    TaskState.INITIALIZING,
    TaskState.RUNNING,
    TaskState.FINISHED,
    TaskState.CANCELING,
    TaskState.CANCELED,
    TaskState.FAILED,
)

# --- the table's laws ----------------------------------------------------------------------------


def test_what_a_taskmanager_may_report_is_rows_of_the_table() -> None:
    # The twelve moves the jobs core takes from a TaskManager or worker (it once had its own copy).
    assert REPORTED == {
        (DE, IN),
        (DE, RU),
        (IN, RU),
        (DE, FI),
        (IN, FI),
        (RU, FI),
        (DE, FA),
        (IN, FA),
        (RU, FA),
        (CI, CA),
        (CI, FA),
        (CI, FI),
    }
    assert REPORTED <= {(m.old, m.new) for m in TASK_MOVES if not m.restart}
    assert not hasattr(core, "LEGAL")


def test_a_restart_is_a_row_into_a_new_attempt() -> None:
    restarts = {m for m in TASK_MOVES if m.restart}
    assert restarts == {Move(FA, C, True), Move(C, C, True)}
    # Only a restart enters CREATED, and an attempt that is over moves only to a new one.
    assert all(m.restart for m in TASK_MOVES if m.new == C)
    assert all(m.restart for m in TASK_MOVES if m.old in TERMINAL_TASK)
    assert not any(TASK_MOVES[m].reported for m in restarts)


def _reached(moves: set[tuple], start: object) -> set:
    seen, todo = {start}, deque([start])
    while todo:
        here = todo.popleft()
        for old, new in moves:
            if old == here and new not in seen:
                seen.add(new)
                todo.append(new)
    return seen


def test_every_state_is_reached_and_nothing_but_a_restart_leaves_an_ended_one() -> None:
    assert _reached({(m.old, m.new) for m in TASK_MOVES}, C) == set(TaskState)
    assert _reached(set(JOB_MOVES), JobStatus.CREATED) == set(JobStatus)  # (no RESTARTING that nothing reaches)
    assert not any(old in TERMINAL_JOB for old, _ in JOB_MOVES)


def test_the_groups_partition_the_states_as_the_table_moves_them() -> None:
    assert TERMINAL_TASK == {FI, CA, FA} and ABORTED_TASK == TERMINAL_TASK - {FI}
    assert {C} | HOLDS_SLOT | TERMINAL_TASK == set(TaskState) and not HOLDS_SLOT & TERMINAL_TASK
    assert HOLDS_SLOT == {SC} | LIVE_TASK | STOPPING_TASK and not LIVE_TASK & STOPPING_TASK
    assert UNDEPLOYED_TASK == {C, SC} and STARTED_TASK == {RU, FI}
    assert LIVE_JOB | STOPPING_JOB | TERMINAL_JOB == set(JobStatus)
    assert not (LIVE_JOB & STOPPING_JOB or LIVE_JOB & TERMINAL_JOB or STOPPING_JOB & TERMINAL_JOB)
    assert ABORTED_JOB == TERMINAL_JOB - {JobStatus.FINISHED}
    # A slot is taken only by the scheduler's move; a stopping attempt only ends; a stopping
    # job only ends, and only a live one begins to stop.
    assert {(m.old, m.new) for m in TASK_MOVES if m.new in HOLDS_SLOT and m.old not in HOLDS_SLOT} == {(C, SC)}
    assert all(m.new in TERMINAL_TASK for m in TASK_MOVES if m.old in STOPPING_TASK)
    assert all(new in TERMINAL_JOB for old, new in JOB_MOVES if old in STOPPING_JOB)
    assert all(old in LIVE_JOB for old, new in JOB_MOVES if new in STOPPING_JOB)


class MovesMachine(JobsMachine):
    """The jobs model, watching every move its cores make from the facts alone (its own
    record of each subtask's attempt and state, not evolve's): each must be a row of the
    table, numbered as the row says."""

    def __init__(self) -> None:
        super().__init__()
        self.graphs: dict[str, JobGraph] = {}
        self.at: dict[tuple[str, str, int], tuple[int, TaskState]] = {}
        self.status: dict[str, JobStatus] = {}

    def folded(self, fact: Event) -> None:
        super().folded(fact)
        if type(fact) is JobSubmitted:
            self.graphs[fact.job_id], self.status[fact.job_id] = fact.graph, JobStatus.CREATED
        elif type(fact) is ExecutionGraphBuilt:
            for v in self.graphs[fact.job_id].vertices:
                for i in range(v.parallelism):
                    self.at[(fact.job_id, v.name, i)] = (fact.first_attempt, C)
        elif type(fact) is UpdateTaskExecutionState:
            key = (fact.job_id, fact.vertex_id, fact.subtask)
            attempt, old = self.at[key]
            assert attempt == fact.attempt and Move(old, fact.state) in TASK_MOVES, (
                f"{fact.execution_id}: {old.value} -> {fact.state.value} (at attempt {attempt}) is not in the table"
            )
            self.at[key] = (attempt, fact.state)
        elif type(fact) is TaskRestartScheduled:
            key = (fact.job_id, fact.vertex_id, fact.subtask)
            attempt, old = self.at[key]
            assert fact.attempt > attempt and Move(old, C, restart=True) in TASK_MOVES, (
                f"{key}: a restart from {old.value} at attempt {attempt} as {fact.attempt} is not in the table"
            )
            self.at[key] = (fact.attempt, C)
        elif type(fact) is JobStatusChanged:
            old = self.status[fact.job_id]
            assert (old, fact.status) in JOB_MOVES, f"{fact.job_id}: {old.value} -> {fact.status.value}"
            self.status[fact.job_id] = fact.status


TestEveryMoveIsInTheTable = MovesMachine.TestCase
TestEveryMoveIsInTheTable.settings = settings(
    max_examples=max(EXAMPLES // 3, 20),
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# --- an illegal move tells its story -------------------------------------------------------------


def deploying() -> tuple[JobsState, SubmitTask]:
    """One source subtask, deployed on tm-a: its attempt 0 is DEPLOYING."""
    graph = JobGraph("g", [JobVertex("src", "source", 1, source=SourceSpec("text", ["/x"], 100))], [], 128)
    state = JobsState()
    core.decide(
        state, core.Submit(SubmitJob("j1", graph, "blob", "mod", "client-inbox"), {"src": []}, "file:///s"), 1_000
    )
    d = core.decide(state, core.Schedule("j1", {"tm-a": [0]}), 2_000)
    (task,) = [ev for _, ev in d.sends if isinstance(ev, SubmitTask)]
    return state, task


def fold(state: JobsState, fact: Event, ts: int = 3_000) -> None:
    evolve(state, Envelope(fact, "1-1", 0, ts))


def test_an_illegal_move_names_the_legal_ones_and_tells_the_story() -> None:
    state, task = deploying()
    with pytest.raises(IllegalTransition) as err:
        fold(state, UpdateTaskExecutionState("j1", task.execution_id, C, None, "src", 0, 0))
    text = str(err.value)
    assert "src:0:0: DEPLOYING -> CREATED (a move of attempt 0; the subtask is at attempt 0)" in text
    assert "is not a legal move of a task" in text
    assert "From DEPLOYING it may move to: INITIALIZING (the same attempt: its TaskManager started it)" in text
    assert "Its story: 2000 0: CREATED->SCHEDULED; 2000 0: SCHEDULED->DEPLOYING" in text


def test_a_fact_about_another_attempt_is_refused_with_the_story() -> None:
    state, task = deploying()
    with pytest.raises(IllegalTransition) as err:
        fold(state, UpdateTaskExecutionState("j1", "src:0:3", RU, None, "src", 0, 3))
    text = str(err.value)
    assert "src:0:3: DEPLOYING -> RUNNING (a move of attempt 3; the subtask is at attempt 0)" in text
    assert "a fact about another attempt than the current one" in text and "SCHEDULED->DEPLOYING" in text


def test_a_restart_is_checked_by_the_same_table() -> None:
    state, task = deploying()
    with pytest.raises(IllegalTransition) as err:  # from an attempt that still runs
        fold(state, TaskRestartScheduled("j1", "src", 0, 1, 3_000, 1))
    assert (
        "src:0:0: DEPLOYING -> CREATED (a restart as attempt 1; the subtask is at attempt 0) is not a legal "
        "move of a task" in str(err.value)
    )
    fold(state, UpdateTaskExecutionState("j1", task.execution_id, FA, "boom", "src", 0, 0))
    with pytest.raises(IllegalTransition) as err:  # not numbered higher
        fold(state, TaskRestartScheduled("j1", "src", 0, 0, 3_000, 1))
    assert "a new attempt is numbered higher than the current one" in str(err.value)
    assert "0: DEPLOYING->FAILED" in str(err.value)
    fold(state, TaskRestartScheduled("j1", "src", 0, 1, 3_000, 1))  # the row: FAILED -> a new attempt
    ex = state.jobs["j1"].vertices["src"].subtasks[0]
    assert (ex.attempt, ex.state, ex.history[-1]) == (1, C, (3_000, "0: restarted as attempt 1"))


def test_an_illegal_job_move_tells_the_story() -> None:
    state, _ = deploying()
    fold(state, JobStatusChanged("j1", JobStatus.CANCELLING, "stop"))
    with pytest.raises(IllegalTransition) as err:
        fold(state, JobStatusChanged("j1", JobStatus.RUNNING, None))
    assert (
        str(err.value) == "job j1: CANCELLING -> RUNNING is not a legal move of a job. "
        "Its story: 3000 CREATED->CANCELLING"
    )


# --- one handler per fact ------------------------------------------------------------------------


def test_a_fact_without_a_handler_is_refused() -> None:
    state, _ = deploying()
    with pytest.raises(
        IllegalTransition,
        match=r"TaskManagerLost is not a fact of a job's stream: evolve has no "
        r"handler for it .*entry 1-1",
    ):
        fold(state, TaskManagerLost("tm-a", "s1", "no heartbeat"))


def test_queryable_state_facts_have_their_handlers() -> None:
    from sluice.services.jobs.state import _HANDLERS

    assert kvreg.FACTS <= set(_HANDLERS)
    assert machine.check_job("j1", JobStatus.CREATED, JobStatus.RUNNING, None) == "every source runs"


def test_a_legal_move_is_told_why() -> None:
    why = machine.check_task("src:0:0", RU, FI, None, current=0, attempt=0)
    assert (why.text, why.reported) == ("it finished", True)
    why = machine.check_task("src:0:0", FA, C, None, current=0, attempt=2, restart=True)
    assert why.text.startswith("restarted") and not why.reported
    with pytest.raises(IllegalTransition, match="Its story: \\(no earlier moves\\)"):
        machine.check_task("src:0:0", FI, RU, None, current=0, attempt=0)
