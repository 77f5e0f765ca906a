"""The control bench's deployment check looks only at what deployed since its last poll,
yet says "all deployed" exactly when a full scan would (hypothesis: any sequence of
subtask states, moving forward or restarting)."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from sluice.events import TaskState
from tools.bench.control import _deployed_up_to

STATES = [TaskState.CREATED, TaskState.SCHEDULED, TaskState.DEPLOYING, TaskState.RUNNING, TaskState.FINISHED]


@dataclass
class _Ex:
    state: TaskState


@dataclass
class _Run:
    subtasks: list[_Ex]

    def executions(self):
        yield from self.subtasks


def _all_deployed(run: _Run) -> bool:  # the bench's old check: a full scan at every poll
    return all(ex.state not in (TaskState.CREATED, TaskState.SCHEDULED) for ex in run.executions())


@given(
    st.integers(1, 12).flatmap(
        lambda n: st.lists(st.lists(st.sampled_from(STATES), min_size=n, max_size=n), min_size=1, max_size=20)
    )
)
def test_the_incremental_check_agrees_with_a_full_scan(polls: list[list[TaskState]]) -> None:
    run = _Run([_Ex(s) for s in polls[0]])
    frontier = 0
    for states in polls:
        for ex, s in zip(run.subtasks, states):
            ex.state = s
        frontier = _deployed_up_to(run, frontier)
        assert (frontier < 0) == _all_deployed(run)
        if frontier < 0:
            return  # the bench stops looking once all deployed


def test_a_poll_starts_where_the_last_one_stopped() -> None:
    run = _Run([_Ex(TaskState.DEPLOYING), _Ex(TaskState.SCHEDULED), _Ex(TaskState.CREATED)])
    assert _deployed_up_to(run, 0) == 1
    run.subtasks[1].state = TaskState.DEPLOYING
    assert _deployed_up_to(run, 1) == 2
    run.subtasks[2].state = TaskState.RUNNING
    assert _deployed_up_to(run, 2) == -1
