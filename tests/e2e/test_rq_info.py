"""``rq info`` on Sluice's Redis names each slot queue and RQ worker for its TaskManager
and slot: a TaskManager with real RQ workers, a no-op job through it, RQ's own CLI, given
the cluster's RQ prefix as the docs say (``RQ_KEY_PREFIX='{<p>:rq}' rq info --url …``)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.store import Keys
from sluice.store.rq_keys import rq_environ
from tests.e2e.conftest import MARGIN, TEARDOWN, Processes, wait_until, worker_pids
from tests.e2e.test_submit import NOOP, submit

RQ = Path(sys.executable).with_name("rq")
"""RQ's CLI; ``python -m rq.cli`` where the venv has no script of its own (a worktree's)."""


def rq_info(redis_url: str, prefix: str, *queues: str) -> str:
    proc = subprocess.run(
        [*([str(RQ)] if RQ.exists() else [sys.executable, "-m", "rq.cli"]), "info", "--url", redis_url, *queues],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **rq_environ(Keys(prefix))},
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.timeout(60 + 60 + 120 + 60 + MARGIN + TEARDOWN)  # the workers, rq info, the job, rq info
def test_rq_info_lists_each_slot_queue_and_worker_by_taskmanager_and_slot(
    procs: Processes, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    procs.start("jm", "jobmanager", "--storage-root", (tmp_path / "s").as_uri())
    procs.start("tm-7", "taskmanager", "--resource-id", "tm-7", "--slots", "2")
    queues = [f"{prefix}:tm-7:slot-0", f"{prefix}:tm-7:slot-1"]
    workers = wait_until(
        lambda: (
            len(w := {s: worker_pids(prefix, "tm-7", s) for s in (0, 1)}) == 2
            and all(len(p) == 1 for p in w.values())
            and w
        ),
        "the two slot workers to start",
        timeout=60,
    )
    names = {s: f"tm-7/slot-{s}@{socket.gethostname()}.{workers[s][0]}" for s in (0, 1)}
    # Each worker, as soon as it serves its slot's queue (before the first task).
    # (A worker registers with RQ once its process has started: seconds on a loaded machine.)
    out = wait_until(
        lambda: all(n in (o := rq_info(redis_url, prefix)) for n in names.values()) and o,
        "rq info to list both workers",
        timeout=60,
    )
    for slot, name in names.items():
        assert re.search(rf"^{re.escape(name)} \(.*\): idle {re.escape(queues[slot])}\.", out, re.M), out

    noop = tmp_path / "noop.py"
    noop.write_text(NOOP)
    ran = submit(redis_url, prefix, tmp_path, str(noop), "-p", "n=6", "--wait")
    assert ran.returncode == 0, ran.stderr + ran.stdout
    out = rq_info(redis_url, prefix)
    # Both slots were free when the job's first pass deployed: each queue carried tasks, and
    # RQ lists it with its counts (listed from the worker's start: see store/slots.py).
    for q in queues:
        assert re.search(rf"^{re.escape(q)} \| \d+, \d+ executing, \d+ finished, \d+ failed$", out, re.M), out
    # Each slot's worker by name (a worker the TaskManager replaced meanwhile under its new pid).
    workers = wait_until(
        lambda: (
            len(w := {s: worker_pids(prefix, "tm-7", s) for s in (0, 1)}) == 2
            and all(len(p) == 1 for p in w.values())
            and w
        ),
        "one worker per slot",
        timeout=60,
    )
    out = wait_until(
        lambda: (
            all(
                f"tm-7/slot-{s}@{socket.gethostname()}.{workers[s][0]}" in (o := rq_info(redis_url, prefix))
                for s in (0, 1)
            )
            and o
        ),
        "rq info to list both workers",
        timeout=60,
    )
    for slot in (0, 1):
        name = f"tm-7/slot-{slot}@{socket.gethostname()}.{workers[slot][0]}"
        assert re.search(rf"^{re.escape(name)} \(.*\): idle {re.escape(queues[slot])}\. jobs: ", out, re.M), out
    # Every key RQ made for this cluster is under its prefix: none is left under RQ's own.
    import redis

    client = redis.Redis.from_url(redis_url)
    assert list(client.scan_iter(match=f"rq:*{prefix}*", count=1000)) == []
    rq = Keys(prefix).rq_prefix
    assert {f"{rq}:queue:{q}".encode() for q in queues} <= client.smembers(f"{rq}:queues")
    assert list(client.scan_iter(match=f"{rq}:worker:*", count=1000))


@pytest.mark.slow
@pytest.mark.timeout(120 + 60 + MARGIN + TEARDOWN)  # the job, rq info
def test_a_job_runs_with_the_slot_queues_on_a_redis_of_their_own(
    procs: Processes, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    """``$SLUICE_RQ_REDIS_URL``: the TaskManager queues its tasks, and its workers take them,
    on a second redis-server (RQ stays on a single node when the log is a Redis Cluster);
    the log's Redis holds none of RQ's keys, and ``rq info`` on the second lists the queues."""
    import redis

    from sluice.services.embedded import RedisServer

    second = RedisServer(None)
    rq_url = second.start()
    try:
        env = {"SLUICE_RQ_REDIS_URL": rq_url}
        procs.start("jm", "jobmanager", "--storage-root", (tmp_path / "s").as_uri(), env=env)
        procs.start("tm-q", "taskmanager", "--resource-id", "tm-q", "--slots", "2", env=env)
        noop = tmp_path / "noop.py"
        noop.write_text(NOOP)
        ran = submit(redis_url, prefix, tmp_path, str(noop), "-p", "n=4", "--wait")
        assert ran.returncode == 0 and "FINISHED" in ran.stdout, ran.stderr + ran.stdout
        rq = Keys(prefix).rq_prefix
        assert list(redis.Redis.from_url(redis_url).scan_iter(match=f"{rq}*", count=1000)) == []
        queues = [f"{prefix}:tm-q:slot-{s}" for s in (0, 1)]
        assert {f"{rq}:queue:{q}".encode() for q in queues} <= redis.Redis.from_url(rq_url).smembers(f"{rq}:queues")
        out = rq_info(rq_url, prefix)
        finished = [int(m) for m in re.findall(rf"^{re.escape(prefix)}:tm-q:slot-\d \| .* (\d+) finished", out, re.M)]
        assert len(finished) == 2 and sum(finished) == 4, out
    finally:
        procs.stop_all()
        second.stop()
