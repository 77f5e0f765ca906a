"""The leader waits a moment on reports that decide nothing (``JobManager.linger_ms``).

A task's hand-over reports (its start acknowledged, INITIALIZING) and its RUNNING free no
slot and deploy nothing. Read alone, they cost a commit of their own, and a short task's end
a second one a millisecond or two later: two of the leader's three commits per no-op task
(``scripts/bench tasks``). A read that brings only such reports waits up to ``linger_ms``
for more, so they are decided with what follows; a read with anything else in it is
decided at once, and a step that may not block (the simulation's) never waits.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from sluice.events import TaskState, UpdateTaskExecutionState, descriptor_from_json
from sluice.services.jobmanager.process import JobManager
from sluice.services.taskmanager.worker import report_state
from sluice.store import EventLog
from tests.services.failover_helpers import events, pump, report, source_graph, started, submit


def _launched(log: EventLog, tmp_path: Path) -> tuple[Any, JobManager, dict]:
    """A leader whose one task was just handed over: its hand-over reports wait, unread, in
    the job's inbox."""
    world, a, t, slots = started(log, tmp_path, n=1)
    submit(log, world, "j1", source_graph("j1", splits=1))
    pump(
        [lambda: a.step(block_ms=None), lambda: t.step(block_ms=None)],
        lambda: bool(slots.launched),
        what="the launch",
        world=world,
        advance_ms=10,
    )
    ((_, descriptor, _),) = slots.launched
    return world, a, descriptor


def _spy(a: JobManager, after_first_read: Any = None) -> tuple[list[str], list[int | None]]:
    """The tags the leader commits to, and the blocking of each read it makes, from now on
    (``after_first_read`` is called once the first read has returned)."""
    commits: list[str] = []
    reads: list[int | None] = []
    commit, read = a.committer.commit, a.consumer.read

    def counted_commit(tag: str, *args: Any, **kw: Any) -> Any:
        commits.append(tag)
        return commit(tag, *args, **kw)

    def counted_read(**kw: Any) -> Any:
        reads.append(kw.get("block_ms"))
        got = read(**kw)
        if len(reads) == 1 and after_first_read is not None:
            after_first_read()
        return got

    a.committer.commit = counted_commit  # type: ignore[method-assign]
    a.consumer.read = counted_read  # type: ignore[method-assign]
    return commits, reads


def _states(log: EventLog) -> list[TaskState]:
    facts = events(log, log.keys.facts(log.keys.job("j1")), UpdateTaskExecutionState)
    return [ev.state for ev in facts]


@pytest.mark.timeout(60)
def test_reports_that_decide_nothing_wait_for_the_tasks_end_and_are_decided_with_it(
    log: EventLog, tmp_path: Path
) -> None:
    world, a, d = _launched(log, tmp_path)
    a.linger_ms = 10_000  # as long as it takes: the end comes 0.2 s after the first read
    ends = threading.Timer(
        0.2, lambda: report_state(log, world, descriptor_from_json(d), "tm-1", 0, TaskState.RUNNING, TaskState.FINISHED)
    )  # as a no-op task does
    commits, reads = _spy(a, after_first_read=ends.start)
    try:
        a.step(block_ms=50)
    finally:
        ends.join()
    assert reads == [50, 10_000]  # the hand-over's reports alone, then what followed them
    assert _states(log)[-3:] == [TaskState.INITIALIZING, TaskState.RUNNING, TaskState.FINISHED]
    job = log.keys.job("j1")
    assert commits.count(job) == 1  # one decision for the four reports (and the job's end with them)


@pytest.mark.timeout(60)
def test_a_read_with_anything_else_in_it_is_decided_at_once(log: EventLog, tmp_path: Path) -> None:
    world, a, d = _launched(log, tmp_path)
    a.linger_ms = 10_000
    report(log, world, d, "tm-1", 0, TaskState.FINISHED)  # a slot frees: the next task must not wait
    commits, reads = _spy(a)
    a.step(block_ms=50)
    assert reads == [50]
    assert _states(log)[-2:] == [TaskState.INITIALIZING, TaskState.FINISHED]


@pytest.mark.timeout(60)
def test_a_step_that_may_not_block_never_waits(log: EventLog, tmp_path: Path) -> None:
    """The simulation's steps and the tests' (``block_ms=None``) read once: a step never sleeps."""
    world, a, d = _launched(log, tmp_path)
    a.linger_ms = 10_000
    commits, reads = _spy(a)
    a.step(block_ms=None)
    assert reads == [None]
    assert _states(log)[-1] == TaskState.INITIALIZING
