"""The balance bench's idle measure (tools/bench/balance.py ``idle``) on facts made by the
coordination core: how long each reader was idle at the end of reading, and for how much
of that the other held splits it had not started (read whole: until told "no more")."""

from __future__ import annotations

from sluice.events import TaskState
from tests.cores import CoordinatorsDriven
from tests.views.test_split_outcomes import main_loop, request, state
from tools.bench.balance import idle


def _run(each_split: bool) -> CoordinatorsDriven:
    """Subtask 1 takes a split and finishes; subtask 0 takes two, is told no more, finishes last."""
    loop = main_loop(splits=3, each_split=each_split)
    loop.batch(state(0, 0, TaskState.RUNNING), state(1, 0, TaskState.RUNNING))
    loop.batch(request(1, 0, 1))
    loop.batch(request(0, 0, 1))
    loop.batch(request(1, 0, 2))  # the last split
    loop.batch(request(1, 0, 3))  # no more
    loop.batch(state(1, 0, TaskState.FINISHED))
    loop.batch(request(0, 0, 2))  # no more
    loop.batch(state(0, 0, TaskState.FINISHED))
    return loop


def _ts(loop: CoordinatorsDriven, subtask: int, what: str) -> int:
    """The time of a subtask's FINISHED, first split answer or no-more answer in ``loop``."""
    from sluice.services.coordination.timeline import split_timeline, told_no_more

    envs = loop.envelopes()
    if what == "finished":
        return next(
            e.ts for e in envs if getattr(e.event, "state", None) == TaskState.FINISHED and e.event.subtask == subtask
        )
    if what == "first":
        return min(r.at for r in split_timeline(envs) if r.subtask == subtask)
    return told_no_more(envs)[("src", subtask, 0)]


def test_read_whole_the_reader_done_first_is_idle_while_the_other_holds_splits_until_told_no_more() -> None:
    loop = _run(each_split=False)
    got = idle(loop.envelopes(), "src", whole=True)
    end, done = _ts(loop, 0, "finished"), _ts(loop, 1, "finished")
    assert got[0] == (0.0, 0.0)  # it ended reading: never idle
    assert got[1][0] == (end - done) / 1000 > 0
    assert got[1][1] == (_ts(loop, 0, "no more") - done) / 1000 > 0  # until subtask 0 was told no more
    assert got[1][1] < got[1][0]  # after that it worked on what it held


def test_read_each_split_a_reader_never_holds_a_split_unstarted() -> None:
    loop = _run(each_split=True)
    got = idle(loop.envelopes(), "src", whole=False)
    assert got[1][0] > 0 and got[1][1] == 0.0 and got[0] == (0.0, 0.0)


def test_no_reader_finished_means_nothing_to_say() -> None:
    loop = main_loop()
    loop.batch(state(0, 0, TaskState.RUNNING), request(0, 0, 1))
    assert idle(loop.envelopes(), "src", whole=True) == {}
