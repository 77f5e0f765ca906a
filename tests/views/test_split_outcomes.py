"""What ``inspect splits`` says became of each split, on facts made by the coordination
core (no Redis): the JobManager's loop is played by hand, feeding facts and committing
what the coordinators flush after them, as one batch commits them."""

from __future__ import annotations

from sluice.events import (
    JobVertex,
    RequestNextInputSplit,
    SourceSpec,
    TaskRestartScheduled,
    TaskState,
    UpdateTaskExecutionState,
)
from sluice.services.coordination.source import plan_range
from sluice.services.coordination.timeline import held_back, split_timeline
from tests.cores import CoordinatorsDriven, cores_checked

JOB = "j1"
__all__ = ["cores_checked"]  # (the fixture: every loop checked at each test's end)


def main_loop(parallelism: int = 2, splits: int = 3, each_split: bool = False) -> CoordinatorsDriven:
    """The JobManager's main loop over one job's coordinators (tests/cores.py): each ``batch``
    feeds its facts and appends them, then what the coordinators did, to the log."""
    src = JobVertex("src", "source", parallelism, source=SourceSpec("range", [], 1, {}, "input-splits", each_split))
    loop = CoordinatorsDriven(JOB, [src], {"src": plan_range(0, splits, 1)}, lambda name: type)
    loop.coords.start(0)
    return loop


def request(subtask: int, attempt: int, seq: int, at: int = 0) -> RequestNextInputSplit:
    return RequestNextInputSplit(JOB, "src", subtask, f"src:{subtask}:{attempt}", "host-a", seq, at)


def state(subtask: int, attempt: int, to: TaskState) -> UpdateTaskExecutionState:
    return UpdateTaskExecutionState(
        JOB,
        f"src:{subtask}:{attempt}",
        to,
        "boom" if to == TaskState.FAILED else None,
        "src",
        subtask,
        attempt,
        "tm-1",
        subtask,
    )


def test_a_split_answered_after_its_attempt_failed_in_the_same_batch_is_returned_not_reading() -> None:
    loop = main_loop()
    for subtask in (0, 1):
        loop.batch(state(subtask, 0, TaskState.RUNNING))
    # One batch: attempt 0 of src[0] asks, fails, and is restarted. The coordinators answer
    # after the batch's facts, so the log has the answer after the FAILED.
    loop.batch(request(0, 0, 1), state(0, 0, TaskState.FAILED), TaskRestartScheduled(JOB, "src", 0, 1, loop.now, 1))
    # Then attempt 1 and src[1] read the rest, and finish.
    loop.batch(state(0, 1, TaskState.RUNNING))
    for seq in range(1, 5):
        loop.batch(request(0, 1, seq))
    loop.batch(request(1, 0, 1))
    loop.batch(state(0, 1, TaskState.FINISHED), state(1, 0, TaskState.FINISHED))

    rows = split_timeline(loop.envelopes())
    by_attempt = {(r.subtask, r.attempt, r.split): r.outcome for r in rows}
    assert (0, 0, 0) in by_attempt  # the split attempt 0 was answered with, after it failed
    assert by_attempt[(0, 0, 0)] == "returned"
    assert "reading" not in by_attempt.values()
    finished = sorted(r.split for r in rows if r.outcome == "finished")
    assert finished == [0, 1, 2]  # assignment is right: every split read to its end exactly once


def test_a_split_held_by_a_running_attempt_is_reading() -> None:
    loop = main_loop(parallelism=1)
    loop.batch(state(0, 0, TaskState.RUNNING))
    loop.batch(request(0, 0, 1))
    (row,) = split_timeline(loop.envelopes())
    assert (row.split, row.attempt, row.outcome) == (0, 0, "reading")


def test_a_reader_told_no_more_while_splits_were_left_is_named_with_how_many_went_after() -> None:
    """The end game of a source read each split: the slow reader (5 s a split) asks with two
    splits left that the fast one (1 s a split) finishes first; a reader told "no more"
    once nothing was left is not held back."""
    loop = main_loop(splits=8, each_split=True)
    for subtask in (0, 1):
        loop.batch(state(subtask, 0, TaskState.RUNNING))
    loop.batch(request(0, 0, 1, at=1000), request(1, 0, 1, at=1000))
    for seq, at in enumerate((2000, 3000, 4000, 5000), start=2):
        loop.batch(request(0, 0, seq, at=at))
    loop.batch(request(1, 0, 2, at=6000))  # held back: two splits left
    for seq, at in enumerate((6000, 7000, 8000), start=6):  # the last: told no more with nothing left
        loop.batch(request(0, 0, seq, at=at))
    assert held_back(loop.envelopes()) == {("src", 1, 0): 2}
    rows = split_timeline(loop.envelopes())
    assert [(r.split, r.subtask) for r in rows] == [(0, 0), (1, 1), (2, 0), (3, 0), (4, 0), (5, 0), (6, 0), (7, 0)]
    without_times = main_loop(splits=8, each_split=True)
    for ev in [
        state(0, 0, TaskState.RUNNING),
        state(1, 0, TaskState.RUNNING),
        request(0, 0, 1),
        request(1, 0, 1),
        *[request(0, 0, seq) for seq in range(2, 6)],
        request(1, 0, 2),
        *[request(0, 0, seq) for seq in range(6, 9)],
    ]:
        without_times.batch(ev)
    assert held_back(without_times.envelopes()) == {}


def test_a_split_given_back_after_a_reader_was_told_no_more_does_not_count_as_left_then() -> None:
    """Reader 0 is told "no more" with nothing left; then reader 1's attempt fails and its
    next attempt takes its split again: reader 0 was not held back."""
    loop = main_loop(splits=2)
    for subtask in (0, 1):
        loop.batch(state(subtask, 0, TaskState.RUNNING))
    loop.batch(request(0, 0, 1), request(1, 0, 1))
    loop.batch(request(0, 0, 2))  # none left: no more
    loop.batch(state(1, 0, TaskState.FAILED), TaskRestartScheduled(JOB, "src", 1, 1, 0, 1))
    loop.batch(state(1, 1, TaskState.RUNNING))
    loop.batch(request(1, 1, 1))
    assert [(r.split, r.subtask, r.attempt) for r in split_timeline(loop.envelopes())][-1] == (1, 1, 1)
    assert held_back(loop.envelopes()) == {}
