"""``scripts/bench soak``: a few no-op jobs on a real cluster (no Spark), a row each few jobs."""

from __future__ import annotations

import pytest

from tools.bench.soak import EVERY, Row, per_job


def _row(jobs: int, used: int) -> Row:
    return Row(jobs, 0.0, used, 0, 0, used // 2, 0.0, {})


def test_the_bytes_a_job_adds_are_measured_after_the_warm_up() -> None:
    rows = [_row(0, 1_000), _row(EVERY, 50_000), _row(2 * EVERY, 60_000), _row(3 * EVERY, 70_000)]
    assert per_job(rows) == 100.0 and per_job(rows, "sluice_bytes") == 50.0
    assert per_job(rows[:2]) is None


@pytest.mark.timeout(300)
@pytest.mark.parametrize("purge", [False, True])
def test_a_soak_of_five_jobs_runs_and_releases_each_jobs_transport(purge: bool) -> None:
    from tools.bench.soak import run

    rows = run(jobs=5, purge=purge, every=5)
    assert [r.jobs for r in rows] == [0, 5]
    last = rows[-1]
    assert last.streams.get("subtask inbox", 0) == 0 and last.streams.get("outbox", 0) <= 2 * 5  # the last second
    facts = last.streams.get("facts", 0)
    assert facts <= 20 if purge else facts > 5 * 5  # purged: the cluster's facts alone
    assert last.leader_rss_mb > 0
