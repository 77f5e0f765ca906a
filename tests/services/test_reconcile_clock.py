"""Reconciliation's grace period on the leader's monotonic clock, pure (services/jobs/reconcile.py).

A difference between a slot report and the leader's view is acted on once it has lasted
two reports and the grace period. The grace ran on the wall clock the facts are stamped
with: a leader whose clock stepped 10 s forward between two reports failed an attempt
missing from them at once, before a report of it still on the way could arrive; one
stepped back kept a missing attempt counted 10 s longer.
"""

from __future__ import annotations

from sluice.events import AttemptReport
from sluice.services.jobs.reconcile import SlotReport
from sluice.services.jobs.slot_memory import Memory
from tests.cores import CFG, JobsDriven
from tests.services.test_jobs_core import wordcount
from tests.services.test_reconcile_core import GRACE, started, where

STEP_MS = 10_000


class Leader:
    """Reads of the leader's inboxes that bring one TaskManager's (empty) slot report, at
    the sim's wall clock ``sim.now`` and on a monotonic clock (``clock``) of its own."""

    def __init__(self, sim: JobsDriven, tm: str) -> None:
        self.sim, self.tm, self.memory, self.clock = sim, tm, Memory(), 0

    def report(self, report: list[AttemptReport] | None = None) -> int:
        """The facts the report caused."""
        self.memory.read(True)
        self.memory.reading = True
        try:
            out = self.sim.tell(SlotReport(self.memory, self.tm, "s", report or [], GRACE, CFG, clock=self.clock))
        finally:
            self.memory.reading = False
        return sum(len(d.facts) for d in out.jobs)

    def wait(self, ms: int) -> None:
        """Both clocks move on."""
        self.sim.now += ms
        self.clock += ms


def _missing() -> tuple[JobsDriven, Leader]:
    """An attempt RUNNING on its TaskManager, missing from its reports from now on."""
    sim = JobsDriven(wordcount(), {"tm-a": 1, "tm-b": 1})
    t, _ = started(sim)
    leader = Leader(sim, where(sim, t))
    assert leader.report() == 0  # the leader's first read: no report yet counts
    assert leader.report() == 0  # missing, seen once
    return sim, leader


def test_a_step_forward_of_the_leaders_wall_clock_does_not_cut_the_grace_period_short() -> None:
    sim, leader = _missing()
    leader.wait(GRACE // 5)
    sim.now += STEP_MS
    assert leader.report() == 0
    assert sim.job.status.value == "RUNNING" and sim.job.restarts == 0
    leader.wait(GRACE)
    assert leader.report() > 0  # the grace period is over on the leader's own clock
    assert sim.job.restarts == 1


def test_a_step_back_of_the_leaders_wall_clock_does_not_lengthen_the_grace_period() -> None:
    sim, leader = _missing()
    sim.now -= STEP_MS
    leader.wait(GRACE)
    assert leader.report() > 0  # not 10 s later
    assert sim.job.restarts == 1
