"""The no-op tasks bench: its raw RQ baseline waits for its own workers (bad counts: test_bench_cli.py)."""

from __future__ import annotations

from sluice.bench.tasks import _raw_rq


def test_raw_rq_runs_each_count_on_a_queue_of_its_own(redis_url: str) -> None:
    """Twice on one Redis: the second run must not count the first run's finished jobs (it
    used to share one queue, whose finished registry made a second run end at once)."""
    from redis import Redis
    from rq import Queue

    for n in (5, 7):
        assert _raw_rq(redis_url, 1, n).tasks_per_s > 0
    conn = Redis.from_url(redis_url)
    counts = sorted(Queue(q.name, connection=conn).finished_job_registry.count
                    for q in Queue.all(connection=conn) if q.name.startswith("bench-raw-"))
    assert counts[-2:] == [5, 7]
