"""The pure core of bounded storage (services/jobmanager/retention.py, store.log.trim_point):
where a stream may be trimmed, which archived jobs a fact retention lets go, which subtask
inboxes are done with, and when a purge is refused. No Redis."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.errors import ConfigError
from sluice.events import JobStatus
from sluice.services.jobmanager.retention import FactRetention, due_for_purge, purge_refusal
from sluice.store.log import entry_order, successor, trim_point

ids = st.tuples(st.integers(0, 10**13), st.integers(0, 50)).map(lambda t: f"{t[0]}-{t[1]}")


@given(now=st.integers(0, 10**13), keep=st.integers(0, 10**9), bounds=st.lists(st.none() | ids, max_size=4))
def test_a_trim_point_is_below_every_bound_and_the_retention_window(
    now: int, keep: int, bounds: list[str | None]
) -> None:
    cut = trim_point(now, keep, *bounds)
    limits = [entry_order(b) for b in bounds if b is not None] + [(max(now - keep, 0), 0)]
    if cut is None:
        assert min(limits) <= (0, 0)  # nothing may go
    else:
        assert entry_order(cut) == min(limits)  # as far as allowed: no entry at or after a bound goes


@given(ids)
def test_the_successor_of_an_entry_is_the_least_id_after_it(entry: str) -> None:
    assert entry_order(successor(entry)) > entry_order(entry)
    assert entry_order(successor(entry))[0] == entry_order(entry)[0]


@given(archived=st.lists(st.text("abc", min_size=1, max_size=3), unique=True, max_size=20), keep=st.integers(0, 25))
def test_keeping_the_last_n_jobs_lets_the_oldest_go(archived: list[str], keep: int) -> None:
    due = due_for_purge(archived, FactRetention(keep_last=keep), 0, lambda j: None)
    assert due + archived[len(due) :] == archived and len(archived) - len(due) == min(keep, len(archived))


def test_keeping_days_lets_go_the_oldest_jobs_until_one_ended_recently() -> None:
    day = 86_400_000
    ended = {"a": 1 * day, "b": 2 * day, "c": 9 * day, "d": 3 * day}
    asked: list[str] = []

    def ended_at(job: str) -> int:
        asked.append(job)
        return ended[job]

    assert due_for_purge(list(ended), FactRetention(keep_days=2.5), 10 * day, ended_at) == ["a", "b"]
    assert asked == ["a", "b", "c"]  # the rest are younger than the first young one, by archive order
    assert due_for_purge(list(ended), FactRetention(), 10 * day, ended_at) == []


def test_a_fact_retention_is_parsed_or_refused_with_what_to_write() -> None:
    assert FactRetention.parse(None).keeps_all and FactRetention.parse(" keep ").keeps_all
    assert FactRetention.parse("1000") == FactRetention(keep_last=1000)
    assert FactRetention.parse("30d") == FactRetention(keep_days=30.0)
    with pytest.raises(ConfigError, match="e.g. 30d"):
        FactRetention.parse("a month")


def test_a_purge_is_refused_for_an_unknown_job_a_live_one_and_one_still_holding_slots() -> None:
    from types import SimpleNamespace

    job = SimpleNamespace(status=JobStatus.RUNNING)
    assert "job not found: x" in (purge_refusal("x", None, True) or "")
    assert "job not found: x" in (purge_refusal("x", job, False) or "")  # type: ignore[arg-type]
    assert "only an ended job" in (purge_refusal("x", job, True) or "")  # type: ignore[arg-type]
    job.status = JobStatus.FINISHED
    assert "still hold slots" in (purge_refusal("x", job, True, holds_slots=True) or "")  # type: ignore[arg-type]
    assert purge_refusal("x", job, True) is None  # type: ignore[arg-type]
