"""The no-op tasks bench: its raw RQ baseline waits for its own workers (bad counts: test_bench_cli.py)."""

from __future__ import annotations

from tools.bench.tasks import _raw_rq


def test_raw_rq_runs_each_count_on_a_queue_of_its_own(redis_url: str) -> None:
    """Twice on one Redis: the second run must not count the first run's finished jobs (it
    used to share one queue, whose finished registry made a second run end at once)."""
    from redis import Redis
    from rq import Queue

    for n in (5, 7):
        assert _raw_rq(redis_url, 1, n).tasks_per_s > 0
    conn = Redis.from_url(redis_url)
    counts = sorted(
        Queue(q.name, connection=conn).finished_job_registry.count
        for q in Queue.all(connection=conn)
        if q.name.startswith("bench-raw-")
    )
    assert counts[-2:] == [5, 7]


def test_the_cpu_profile_prints_the_budget_the_target_leaves_and_says_when_it_does_not_bound_the_rate() -> None:
    from tools.bench.console import console
    from tools.bench.tasks import Rate, _print_cpu

    raw = Rate(500.0, {"workers": 2.0, "Redis": 0.6, "bench: enqueue, wait": 0.4}, 1.7)
    ours = Rate(230.0, {"workers": 2.9, "Redis": 1.2, "JobManager": 1.4, "TaskManager": 1.4}, 1.65)
    with console.capture() as cap:
        _print_cpu([{"tasks": 2000, "raw": raw, "sluice": ours}])
    text = " ".join(cap.get().split())
    # 0.8x at the same cores busy: 3.0 / 0.8 = 3.75 ms in all; workers and Redis take 4.1
    assert "leaves Sluice 3.75 ms" in text and "alone take 4.10 ms" in text and "leaving -0.35 ms" in text
    assert "they take 2.80 ms" in text and "did not keep as many cores busy" not in text
    with console.capture() as cap:
        _print_cpu([{"tasks": 2000, "raw": Rate(295.0, raw.cpu_ms, 1.07), "sluice": ours}])
    assert "did not keep as many cores busy (raw RQ 1.07, Sluice 1.65)" in " ".join(cap.get().split())


def test_rounds_combine_into_the_median_rate_and_the_mean_cpu() -> None:
    """A round the shared machine slowed (the middle one here) moves the median least."""
    from tools.bench.tasks import Rate, combined

    c = combined(
        [
            Rate(500.0, {"workers": 2.0}, 1.6),
            Rate(300.0, {"workers": 3.0, "Redis": 0.6}, 1.8),
            Rate(520.0, {"workers": 2.2}, 1.7),
        ]
    )
    assert c.tasks_per_s == 500.0 and abs(c.cores - 1.7) < 1e-9
    assert abs(c.cpu_ms["workers"] - 2.4) < 1e-9 and abs(c.cpu_ms["Redis"] - 0.2) < 1e-9
