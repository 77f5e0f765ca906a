"""A slot's RQ queue on a real Redis: a task's reports go in the same transaction as the
task, before it, so a worker that takes the task at once cannot report ahead of them."""

from __future__ import annotations

import threading
import time

import pytest
import redis
from rq import Queue
from rq.job import Job, JobStatus

from sluice.store import EventLog
from sluice.store.slots import SlotQueues
from tests.helpers import env, heartbeat


def _queue(log: EventLog) -> Queue:
    return Queue(log.keys.slot_queue("tm-1", 0), connection=log.backend.client)  # type: ignore[attr-defined]


def test_the_reports_are_in_their_stream_when_a_waiting_worker_gets_the_task(log: EventLog) -> None:
    """A client blocked on the queue (as an idle RQ worker is) is woken by the push and looks
    at the stream at once: both reports are there, in order."""
    inbox = log.keys.inbox(log.keys.job("j1"))
    reports = [(inbox, env(heartbeat(rid="first"))), (inbox, env(heartbeat(rid="second")))]
    seen: list[object] = []
    waiter = log.backend.client  # type: ignore[attr-defined]
    ready = threading.Event()

    def worker() -> None:
        conn = waiter.connection_pool.get_connection()
        try:
            ready.set()
            conn.send_command("BLPOP", _queue(log).key, 10)
            popped = conn.read_response()
            conn.send_command("XLEN", inbox)
            seen.extend([popped, conn.read_response()])
        finally:
            waiter.connection_pool.release(conn)

    t = threading.Thread(target=worker)
    t.start()
    ready.wait()
    deadline = time.monotonic() + 10
    while waiter.info("clients")["blocked_clients"] < 1 and time.monotonic() < deadline:
        time.sleep(0.005)  # until it waits in BLPOP: the push is what wakes it
    handle = SlotQueues(log, "tm-1").enqueue(0, "sluice.bench.tasks.noop", ({}, {}), job_id="h1", description="t",
                                             before=reports)
    t.join(10)
    assert handle == "h1" and seen and seen[0] is not None
    assert seen[1] == 2  # both reports were in before the task could be taken
    assert [e for _, e in log.replay(inbox)] == [e for _, e in reports]


def test_a_report_redis_refuses_leaves_no_task_queued_and_says_why(log: EventLog) -> None:
    bad = log.keys.inbox(log.keys.job("bad"))
    good = log.keys.inbox(log.keys.job("j1"))
    log.backend.set(bad, b"not a stream")
    queues = SlotQueues(log, "tm-1")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        queues.enqueue(0, "sluice.bench.tasks.noop", ({}, {}), job_id="h2", description="t",
                       before=[(good, env(heartbeat())), (bad, env(heartbeat()))])
    assert _queue(log).job_ids == []  # taken back out: no worker runs a task whose start failed
    status = Job.fetch("h2", connection=log.backend.client).get_status()  # type: ignore[attr-defined]
    assert status == JobStatus.CANCELED
    assert log.length(good) == 1  # a transaction does not roll back: the leader ignores a repeated report
