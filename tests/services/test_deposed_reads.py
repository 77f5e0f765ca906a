"""Issue 28, finding 1: a deposed leader that reads one more batch before it notices it
lost the lease must not make the new leader decide an inbox's messages out of order.

On the session's real redis-server, driving the real JobManagers step by step: leader A's
lease lapses while it stalls, B takes over, then A resumes and reads (message #1 moves to
A's pending list; its commit is refused and it steps down). Message #2 follows. B must
decide #1 before #2: it takes over what another consumer holds pending at each read.
Before the fix B decided #2 at once and reclaimed #1 only once it had been idle for a
whole lease, then dropped it as "came again" (or "not running" after FINISHED).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sluice.events import Envelope, OperatorEvent, TaskState
from sluice.services.jobmanager import Phase
from sluice.store import EventLog
from tests.services.failover_helpers import (
    HANDLED,
    ManualWorld,
    coordinated_running,
    jm,
    lead,
    report,
)


def _operator_event(log: EventLog, world: ManualWorld, agg: dict, n: int) -> None:
    """What agg's subtask sends its coordinator: event #n."""
    ev = OperatorEvent("j1", "agg", 0, True, {"n": n}, agg["attempt"], n)
    log.append(log.keys.inbox(log.keys.job("j1")), Envelope(ev, world.new_id(), 0, world.now_ms(), "j1"))


@pytest.mark.timeout(30)
@pytest.mark.parametrize("then", ["next-event", "finished"])
def test_a_message_read_by_a_deposed_leader_is_decided_before_later_ones(
    log: EventLog, tmp_path: Path, then: str
) -> None:
    HANDLED.clear()
    world = ManualWorld()
    a, _, _, agg = coordinated_running(log, world, tmp_path)

    time.sleep(0.4)  # A stalls: its lease lapses (Redis's clock) and B takes over
    b = jm(log, world, "jm-b", tmp_path, lease_ttl_ms=3000)
    assert lead(b, world) == 2
    b_coordinator = id(b.state.coords["j1"].holders["agg"].coordinator)

    _operator_event(log, world, agg, 1)
    a.step(block_ms=None)  # A resumes: one more read before it learns it was deposed
    assert a.phase is Phase.STANDBY  # its commit was refused
    if then == "next-event":
        _operator_event(log, world, agg, 2)
    else:
        report(log, world, agg, "tm-1", 1, TaskState.FINISHED)
    for _ in range(3):
        b.step(block_ms=None)
        world.advance(10)

    assert b.errors == []
    by_b = [ev["n"] for who, _, _, ev in HANDLED if who == b_coordinator]
    assert by_b == ([1, 2] if then == "next-event" else [1])
    job = b.state.jobs.jobs["j1"]
    if then == "finished":
        assert job.vertices["agg"].subtasks[0].state == TaskState.FINISHED
    inbox = log.keys.inbox(log.keys.job("j1"))
    state = log.backend.group_state(inbox, "jobmanager")
    assert state is not None and state.pending == 0  # every message decided, once
