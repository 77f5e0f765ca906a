"""The leader's first-seen times, pure (services/jobs/timers.py): a deadline pending when a
leader took over counts from the takeover (later than it began, never earlier), and one
this leader saw begin counts from then."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from sluice.services.jobs.state import Execution
from sluice.services.jobs.timers import Timers

WALL = 1_800_000_000_000
"""Some leader's wall clock, when it stamped the log: nothing to do with the clocks below."""


def restarted(delay_ms: int) -> Execution:
    """Attempt 1 of src[0], restarted at WALL with ``delay_ms`` before it may run."""
    return Execution("src", 0, 1, since=WALL, not_before=WALL + delay_ms)


def test_a_restart_committed_before_the_takeover_waits_its_delay_from_the_takeover() -> None:
    timers = Timers(started=1_000)
    ex = restarted(3_000)
    assert timers.held_back("j1", ex, 3_999)
    assert not timers.held_back("j1", ex, 4_000)  # from the takeover, not from the first look (at 3,999)


def test_a_restart_this_leader_committed_waits_its_delay_from_then() -> None:
    timers = Timers(started=1_000)
    timers.restart_seen("j1", "src", 0, 1, 10_000)
    ex = restarted(3_000)
    assert timers.held_back("j1", ex, 12_999)
    assert not timers.held_back("j1", ex, 13_000)


def test_an_attempt_that_was_never_delayed_is_not_held_back() -> None:
    assert not Timers(started=1_000).held_back("j1", Execution("src", 0, 0, since=WALL), 1_000)


def _job(waiting_since: int, slot_taken_at: int | None) -> Any:
    return SimpleNamespace(job_id="j1", waiting_since=waiting_since, slot_taken_at=slot_taken_at)


def test_a_wait_for_slots_counts_from_when_first_seen_and_again_from_each_slot_taken() -> None:
    timers = Timers(started=0)
    assert timers.slot_wait(_job(WALL, None), 5_000) == 0
    assert timers.slot_wait(_job(WALL, None), 7_000) == 2_000
    assert timers.slot_wait(_job(WALL, WALL + 100), 8_000) == 0  # a slot taken: progress, counted afresh
    assert timers.slot_wait(_job(WALL, WALL + 100), 9_500) == 1_500
