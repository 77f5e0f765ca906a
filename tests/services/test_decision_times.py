"""The leader's state is the fold of its log, times included, when the clock moves while
it decides.

The leader folds what it decides into its state at once, with the time it decided at, and
the commit stamps every fact with its decision's time. A batch of one job's messages is
one decision: when each message was decided at the clock's time of the moment instead of
the batch's, the live state held times one or two milliseconds off the log's. The leader's
snapshots then carried them, and a projector that starts from a snapshot wrote an
``ended_at`` that ``sluice replay --check`` found differing from the rebuild (seen once in
CI, in the e2e queryable-state test; the simulation, whose clock now creeps within a
step, finds it in most seeds).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sluice.events import TaskState
from sluice.services.jobs.state import JobsState
from sluice.store import EventLog
from tests.services.failover_helpers import (
    ManualWorld,
    job_state,
    pump,
    report,
    source_graph,
    started,
    submit,
)
from tools.sim.invariants import normal_jobs


class CreepingWorld(ManualWorld):
    """A test clock that also moves a millisecond at every read, as a real one does while
    a process works."""

    def now_ms(self) -> int:
        self.now += 1
        return self.now


def _as_data(run: Any) -> dict:
    out = normal_jobs(JobsState({run.job_id: run}))
    out.pop("_pool")
    return out


@pytest.mark.timeout(60)
def test_the_leaders_state_keeps_the_logs_times_while_its_clock_moves(log: EventLog, tmp_path: Path) -> None:
    world, a, t, slots = started(log, tmp_path, n=1, world=CreepingWorld())
    submit(log, world, "j1", source_graph("j1", splits=1))
    compared: list[int | None] = []

    def agree() -> None:
        live = a.state.jobs.jobs.get("j1")
        if live is not None:
            assert _as_data(live) == _as_data(job_state(log, "j1"))
            compared.append(live.ended_at)

    def leader() -> None:
        a.step(block_ms=None)
        agree()

    pump(
        [leader, lambda: t.step(block_ms=None)],
        lambda: bool(slots.launched),
        what="the launch",
        world=world,
        advance_ms=10,
    )
    ((_, descriptor, _),) = slots.launched
    for state in (TaskState.RUNNING, TaskState.FINISHED):
        report(log, world, descriptor, "tm-1", 0, state)
    pump(
        [leader, lambda: t.step(block_ms=None)],
        lambda: job_state(log, "j1").ended_at is not None,
        what="the job's end",
        world=world,
        advance_ms=10,
    )
    assert compared and compared[-1] is not None  # compared with the job ended, before it was archived
