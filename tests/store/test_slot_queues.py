"""A slot's RQ queue on a real Redis: a task's reports go in the same transaction as the
task, before it, so a worker that takes the task at once cannot report ahead of them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from rq import Queue
from rq.job import Job, JobStatus

from sluice.store import EventLog, Keys, connect
from sluice.store.slots import SlotQueues
from tests.conftest import RQ_PREFIX
from tests.helpers import env, heartbeat


@pytest.fixture
def log(rq_log: EventLog) -> EventLog:
    return rq_log  # (tests/store/conftest.py)


def _queue(log: EventLog) -> Queue:
    return Queue(log.keys.slot_queue("tm-1", 0), connection=log.backend.client)  # type: ignore[attr-defined]


def _idle_worker(log: EventLog, then: Callable[[object], object]) -> tuple[threading.Thread, list[object]]:
    """A client blocked on the queue, as an idle RQ worker is: the push wakes it, and it
    calls ``then`` at once with what it popped. Returns once it is blocked."""
    client = log.backend.client  # type: ignore[attr-defined]
    seen: list[object] = []

    def work() -> None:
        conn = client.connection_pool.get_connection()
        try:
            conn.send_command("BLPOP", _queue(log).key, 10)
            popped = conn.read_response()
            seen.extend([popped, then(popped)])
        finally:
            client.connection_pool.release(conn)

    t = threading.Thread(target=work)
    t.start()
    deadline = time.monotonic() + 10
    while client.info("clients")["blocked_clients"] < 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    return t, seen


def during_the_task() -> dict:
    """A task that returns what RQ shows of it while it runs (for the parity tests)."""
    from rq import get_current_job
    from rq.executions import ExecutionRegistry
    from rq.registry import StartedJobRegistry
    from rq.worker import Worker

    job = get_current_job()
    assert job is not None
    conn = job.connection
    worker = next(w for w in Worker.all(connection=conn) if w.name == job.worker_name)
    queue = Queue(job.origin, connection=conn)
    return {
        "status": job.get_status(refresh=True),
        "started": job.id in StartedJobRegistry(queue=queue),
        "executions": len(ExecutionRegistry(job.id, connection=conn).get_execution_ids()),
        "worker": worker.get_state(),
        "intermediate": conn.llen(queue.intermediate_queue_key),
        "fields": sorted(k.decode() for k in conn.hkeys(job.key)),
        "worker_ttl": conn.ttl(worker.key),
    }


def test_the_reports_are_in_their_stream_when_a_waiting_worker_gets_the_task(log: EventLog) -> None:
    inbox = log.keys.inbox(log.keys.job("j1"))
    reports = [(inbox, env(heartbeat(rid="first"))), (inbox, env(heartbeat(rid="second")))]
    t, seen = _idle_worker(log, lambda _: log.length(inbox))
    queues = SlotQueues(log, "tm-1")
    handle = queues.enqueue(0, "tools.bench.tasks.noop", ({}, {}), job_id="h1", description="t", before=reports)
    t.join(10)
    assert handle == "h1" and seen and seen[0] is not None
    assert seen[1] == 2  # both reports were in before the task could be taken
    assert [e for _, e in log.replay(inbox)] == [e for _, e in reports]
    assert queues.exists("h1") and not queues.exists("h-never")


def test_a_report_redis_refuses_leaves_no_task_queued_and_says_why(log: EventLog) -> None:
    bad = log.keys.inbox(log.keys.job("bad"))
    good = log.keys.inbox(log.keys.job("j1"))
    log.backend.set(bad, b"not a stream")
    queues = SlotQueues(log, "tm-1")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        queues.enqueue(
            0,
            "tools.bench.tasks.noop",
            ({}, {}),
            job_id="h2",
            description="t",
            before=[(good, env(heartbeat())), (bad, env(heartbeat()))],
        )
    assert _queue(log).job_ids == []  # taken back out: no worker runs a task whose start failed
    status = Job.fetch("h2", connection=log.backend.client).get_status()  # type: ignore[attr-defined]
    assert status == JobStatus.CANCELED
    assert log.length(good) == 1  # a transaction does not roll back: the leader ignores a repeated report


def test_a_refused_report_does_not_take_back_a_task_a_worker_already_has(log: EventLog) -> None:
    """An idle worker is woken by the push inside the transaction and takes the task before
    it could be taken back: it runs, so it is reported handed over, not failed (the start
    undone under a running task would leave it untracked)."""
    bad = log.keys.inbox(log.keys.job("bad"))
    log.backend.set(bad, b"not a stream")
    t, seen = _idle_worker(log, lambda popped: None)
    queues = SlotQueues(log, "tm-1")
    handle = queues.enqueue(
        0, "tools.bench.tasks.noop", ({}, {}), job_id="h3", description="t", before=[(bad, env(heartbeat()))]
    )
    t.join(10)
    assert handle == "h3" and seen and seen[0] is not None
    status = Job.fetch("h3", connection=log.backend.client).get_status()  # type: ignore[attr-defined]
    assert status == JobStatus.QUEUED  # left to its worker, not cancelled


def _noops_on_a_slot_worker(log: EventLog, name: str, tasks: int) -> tuple[Any, float]:
    """Run ``tasks`` no-op jobs on a burst slot worker named ``name``; the worker and the
    seconds it took (every job finished)."""
    from rq.serializers import JSONSerializer

    from sluice.store.slots import slot_worker_class

    client = log.backend.client  # type: ignore[attr-defined]
    queue = Queue(log.keys.slot_queue("tm-1", 0), connection=client, serializer=JSONSerializer)
    jobs = [queue.enqueue("tools.bench.tasks.noop", job_id=f"noop-{i}") for i in range(tasks)]
    worker = slot_worker_class()([queue], name=name, connection=client, serializer=JSONSerializer)
    started = time.monotonic()
    worker.work(burst=True, with_scheduler=False, logging_level="WARNING")
    took = time.monotonic() - started
    assert all(job.get_status(refresh=True) == JobStatus.FINISHED for job in jobs)
    return worker, took


def test_a_slot_worker_renews_its_registration_at_most_once_a_second_not_three_times_a_task(
    log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RQ renews a worker's registration before and after each dequeue and after each job
    (three round trips each time); a slot's worker skips a renewal within a second of the
    last one. Its registration stays alive, and every task runs."""
    from rq.worker.base import BaseWorker

    from sluice.store.slots import HEARTBEAT_EVERY_S

    renewals: list[float] = []
    real = BaseWorker.heartbeat

    def counted(self: BaseWorker, timeout: int | None = None, pipeline: object = None) -> None:
        if pipeline is None:  # its own round trips (one inside RQ's transactions costs none)
            renewals.append(time.monotonic())
        real(self, timeout, pipeline)  # type: ignore[arg-type]

    monkeypatch.setattr(BaseWorker, "heartbeat", counted)
    tasks = 30
    _, took = _noops_on_a_slot_worker(log, "slot-beats", tasks)
    # RQ alone renews ~3 times a task: 90 here. At most one a second, plus the first.
    assert 1 <= len(renewals) <= took / HEARTBEAT_EVERY_S + 2 < tasks, (len(renewals), took)
    assert all(b - a >= HEARTBEAT_EVERY_S for a, b in zip(renewals, renewals[1:]))


def test_a_slot_worker_waits_through_an_outage_that_begins_between_two_short_tasks(
    log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With its renewal and its `rq suspend` check skipped after a short task, RQ's first
    call to Redis of its own after a task is the write of its state (idle): an outage met
    there is waited through (RQ alone would end its loop, and a slot's worker that ends is
    counted as failed by its TaskManager)."""
    from rq.serializers import JSONSerializer
    from rq.worker.base import BaseWorker

    from sluice.store.connection import Outage
    from sluice.store.slots import slot_worker_class

    real = BaseWorker.set_state
    injected: list[str] = []

    def away_after_the_first_task(self: BaseWorker, state: str, pipeline: object = None) -> None:
        if pipeline is None and state == "idle" and self.get_state() == "busy" and not injected:
            injected.append(state)  # the write after the first task: Redis is away right then
            raise redis.ConnectionError("Connection refused (injected)")
        real(self, state, pipeline)  # type: ignore[arg-type]

    monkeypatch.setattr(BaseWorker, "set_state", away_after_the_first_task)
    client = log.backend.client  # type: ignore[attr-defined]
    probes: list[int] = []

    def probe() -> None:  # the first probe finds Redis still away, the next one back
        probes.append(1)
        if len(probes) == 1:
            raise redis.ConnectionError("still away")
        client.ping()

    said: list[str] = []
    outage = Outage(probe, who="slot 0", url="redis://test", say=said.append)
    queue = Queue(log.keys.slot_queue("tm-1", 0), connection=client, serializer=JSONSerializer)
    jobs = [queue.enqueue("tools.bench.tasks.noop", job_id=f"outage-{i}") for i in range(2)]
    worker = slot_worker_class(outage)([queue], name="slot-outage", connection=client, serializer=JSONSerializer)
    worker.work(burst=True, with_scheduler=False, logging_level="WARNING")
    assert injected
    assert [job.get_status(refresh=True) for job in jobs] == [JobStatus.FINISHED, JobStatus.FINISHED]
    assert outage.outages == 1 and any("is away" in line for line in said) and any("is back" in line for line in said)


def test_a_slot_worker_writes_its_state_once_a_change_and_asks_about_rq_suspend_once_a_second(
    log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RQ writes "idle" after each task and again before each dequeue, and asks whether
    `rq suspend` was called before each dequeue (a round trip each): a slot's worker skips
    the repeated write and asks at most once a second. The state stays right for `rq info`:
    busy while a task runs, idle after."""
    import rq.worker.base
    from rq.worker.base import BaseWorker

    from sluice.store.slots import HEARTBEAT_EVERY_S

    writes: list[str] = []
    asks: list[float] = []
    real_set, real_asked = BaseWorker.set_state, rq.worker.base.is_suspended

    def counted_set(self: BaseWorker, state: str, pipeline: object = None) -> None:
        writes.append(state)
        real_set(self, state, pipeline)  # type: ignore[arg-type]

    def counted_ask(*args: object, **kwargs: object) -> bool:
        asks.append(time.monotonic())
        return bool(real_asked(*args, **kwargs))  # type: ignore[arg-type]

    monkeypatch.setattr(BaseWorker, "set_state", counted_set)
    monkeypatch.setattr(rq.worker.base, "is_suspended", counted_ask)
    client = log.backend.client  # type: ignore[attr-defined]
    tasks = 30
    worker, took = _noops_on_a_slot_worker(log, "slot-states", tasks)
    # RQ alone writes busy, idle, idle a task (90 here): here busy and idle, plus the start.
    assert writes.count("busy") == tasks and writes.count("idle") <= tasks + 1, writes
    assert 1 <= len(asks) <= took / HEARTBEAT_EVERY_S + 2 < tasks, (len(asks), took)
    assert all(b - a >= HEARTBEAT_EVERY_S for a, b in zip(asks, asks[1:]))
    assert client.hget(worker.key, "state") == b"idle"


def test_rq_suspend_stops_a_busy_slot_worker_from_taking_tasks_within_a_second(log: EventLog) -> None:
    """The suspension check asked at most once a second still stops the worker: tasks of
    0.05 s each, `rq suspend` called a quarter of a second in; it takes at most a second's
    worth more (and, in burst mode, stops). Counted in tasks begun after the suspension, not
    in seconds: on a loaded machine each task takes longer, never more of them fit a second."""
    from rq.serializers import JSONSerializer
    from rq.suspension import resume, suspend

    from sluice.store.slots import HEARTBEAT_EVERY_S, slot_worker_class

    client = log.backend.client  # type: ignore[attr-defined]
    queue = Queue(log.keys.slot_queue("tm-1", 0), connection=client, serializer=JSONSerializer)
    jobs = [queue.enqueue("time.sleep", args=(0.05,), job_id=f"nap-{i}") for i in range(100)]
    worker = slot_worker_class()([queue], name="slot-suspend", connection=client, serializer=JSONSerializer)
    suspended_at: list[float] = []

    def suspend_soon() -> None:
        time.sleep(0.25)
        suspended_at.append(time.time())
        suspend(client)

    t = threading.Thread(target=suspend_soon)
    t.start()
    try:
        worker.work(burst=True, with_scheduler=False, logging_level="WARNING")
    finally:
        t.join()
        resume(client)
    for job in jobs:
        job.refresh()
    ran = [job for job in jobs if job.get_status() == JobStatus.FINISHED]
    assert 0 < len(ran) < len(jobs), len(ran)
    after = [job for job in ran if job.started_at is not None and job.started_at.timestamp() > suspended_at[0]]
    assert len(after) <= HEARTBEAT_EVERY_S / 0.05 + 2, len(after)  # a second's worth of tasks, and the one running


def test_a_job_end_is_stamped_by_the_transaction_that_records_its_outcome_not_a_round_trip_of_its_own(
    log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RQ writes a job's heartbeat when it ends, then writes the whole job again with its
    outcome: a slot's worker leaves the stamps to the second write. Both a job that returned
    and one that raised keep their end and last heartbeat."""
    from rq.job import Job as RqJob
    from rq.serializers import JSONSerializer

    from sluice.store.slots import slot_worker_class

    own_writes: list[str] = []
    real = RqJob.heartbeat

    def counted(self: RqJob, timestamp: object, ttl: int, pipeline: object = None, xx: bool = False) -> None:
        if pipeline is None:
            own_writes.append(self.id)
        real(self, timestamp, ttl, pipeline, xx)  # type: ignore[arg-type]

    monkeypatch.setattr(RqJob, "heartbeat", counted)
    client = log.backend.client  # type: ignore[attr-defined]
    queue = Queue(log.keys.slot_queue("tm-1", 0), connection=client, serializer=JSONSerializer)
    ok = queue.enqueue("tools.bench.tasks.noop", job_id="ends-ok")
    bad = queue.enqueue("builtins.int", args=("not a number",), job_id="ends-bad")
    worker = slot_worker_class()([queue], name="slot-ends", connection=client, serializer=JSONSerializer)
    worker.work(burst=True, with_scheduler=False, logging_level="WARNING")
    assert own_writes == []
    for job, status in ((ok, JobStatus.FINISHED), (bad, JobStatus.FAILED)):
        stored = RqJob.fetch(job.id, connection=client, serializer=JSONSerializer)
        assert stored.get_status() == status
        assert stored.started_at and stored.ended_at and stored.last_heartbeat
        assert stored.started_at <= stored.ended_at == stored.last_heartbeat


def test_a_slot_worker_records_a_task_that_returned_as_rq_does_without_reading_its_dependents(
    log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The slot worker's own success path (no watch of the dependents, no read of them: a
    slot's task has none) leaves what RQ's leaves: the job finished with its result, in the
    finished registry and out of the started one, the worker's counters moved, the same
    fields in the job's hash."""
    from redis.client import Pipeline
    from rq import SimpleWorker
    from rq.job import Job as RqJob
    from rq.registry import FinishedJobRegistry, StartedJobRegistry
    from rq.results import Result
    from rq.serializers import JSONSerializer

    from sluice.store.slots import slot_worker_class

    client = log.backend.client  # type: ignore[attr-defined]
    watched: list[tuple[object, ...]] = []
    real_watch = Pipeline.watch

    def counted_watch(self: Pipeline, *names: object) -> object:
        watched.append(names)
        return real_watch(self, *names)  # type: ignore[arg-type]

    seen: dict[str, dict] = {}
    for kind, cls in (("rq", SimpleWorker), ("slot", slot_worker_class())):
        queue = Queue(log.keys.slot_queue(f"tm-{kind}", 0), connection=client, serializer=JSONSerializer)
        job = queue.enqueue("builtins.len", args=("four",), job_id=f"returns-{kind}", result_ttl=600)
        worker = cls([queue], name=f"w-{kind}", connection=client, serializer=JSONSerializer)
        watched.clear()
        monkeypatch.setattr(Pipeline, "watch", counted_watch)
        worker.work(burst=True, with_scheduler=False, logging_level="WARNING")
        monkeypatch.setattr(Pipeline, "watch", real_watch)
        stored = RqJob.fetch(job.id, connection=client, serializer=JSONSerializer)
        result = Result.fetch_latest(stored, serializer=JSONSerializer)
        fields = client.hgetall(worker.key)
        seen[kind] = {
            "status": stored.get_status(),
            "return": result.return_value if result else None,
            "finished": job.id in FinishedJobRegistry(queue=queue),
            "started": job.id in StartedJobRegistry(queue=queue),
            "count": fields.get(b"successful_job_count"),
            "timed": float(fields.get(b"total_working_time", 0)) > 0,
            "hash": sorted(client.hkeys(stored.key)),
            "ttl": 0 < client.ttl(stored.key) <= 600,
            "watched": bool(watched),
        }
    assert seen["rq"]["watched"] and not seen["slot"]["watched"]
    del seen["rq"]["watched"], seen["slot"]["watched"]
    assert seen["slot"] == seen["rq"]
    assert (
        seen["slot"]["status"] == JobStatus.FINISHED and seen["slot"]["return"] == 4 and seen["slot"]["count"] == b"1"
    )


def test_a_slot_worker_starts_a_task_as_rq_does_in_one_round_trip_not_two(log: EventLog) -> None:
    """RQ records the execution and then the task's start in two transactions; the slot
    worker sends them as one. What a running task shows is the same: started, in the
    started registry, one execution, its worker busy, out of the intermediate queue."""
    from rq import SimpleWorker

    from sluice.store.slots import slot_worker_class

    func = f"{__name__}.during_the_task"
    (rq_saw, rq_execs), (slot_saw, slot_execs) = (
        _run_on(log, SimpleWorker, "rq", func),
        _run_on(log, slot_worker_class(), "slot", func),
    )
    assert isinstance(slot_saw, dict) and isinstance(rq_saw, dict)
    # The registration's TTL differs: RQ renews it to worker_ttl + 60 s before each dequeue, the
    # slot worker (which asks once a second) when the task starts (its own test, below).
    assert {**slot_saw, "worker_ttl": 0} == {**rq_saw, "worker_ttl": 0}
    assert slot_saw["status"] == "started" and slot_saw["started"]
    assert slot_saw["executions"] == 1 and slot_saw["worker"] == "busy" and slot_saw["intermediate"] == 0
    assert (rq_execs, slot_execs) == (2, 1)


def test_a_short_task_does_not_shorten_the_slot_workers_registration(log: EventLog) -> None:
    """RQ sets the registration's TTL from the task's timeout when it starts, and renews it
    to worker_ttl + 60 s before the next dequeue; the slot worker skips that renewal within
    a second, so the start sets the longer of the two (an idle worker blocks for minutes on
    its queue and must stay listed)."""
    from rq.defaults import DEFAULT_WORKER_TTL

    from sluice.store.slots import slot_worker_class

    saw, _ = _run_on(log, slot_worker_class(), "short", f"{__name__}.during_the_task", timeout=5)
    assert isinstance(saw, dict) and saw["worker_ttl"] >= DEFAULT_WORKER_TTL + 50, saw


def _run_on(
    log: EventLog, cls: type, name: str, func: str, args: tuple = (), timeout: int | None = None
) -> tuple[object, int]:
    """Run one job of ``func`` on a burst worker of ``cls``: its return value and the
    transactions the worker sent to start it."""
    from redis.client import Pipeline
    from rq.job import Job as RqJob
    from rq.results import Result
    from rq.serializers import JSONSerializer

    client = log.backend.client  # type: ignore[attr-defined]
    queue = Queue(log.keys.slot_queue(name, 0), connection=client, serializer=JSONSerializer)
    job = queue.enqueue(func, args=args, job_id=f"probe-{name}", result_ttl=600, job_timeout=timeout)
    worker = cls([queue], name=f"w-{name}", connection=client, serializer=JSONSerializer)
    execs = 0
    real = Pipeline.execute

    def counted(self: Pipeline, raise_on_error: bool = True) -> list:
        nonlocal execs
        # a transaction that records the execution or the task's start (PERSIST of its hash)
        names = [str(c[0][0]).upper() + " " + str(c[0][1]) for c in self.command_stack if len(c[0]) > 1]
        execs += any(n.startswith((f"HSET {log.keys.rq_prefix}:execution:", "PERSIST ")) for n in names)
        return real(self, raise_on_error)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Pipeline, "execute", counted)
        worker.work(burst=True, with_scheduler=False, logging_level="WARNING")
    result = Result.fetch_latest(
        RqJob.fetch(job.id, connection=client, serializer=JSONSerializer), serializer=JSONSerializer
    )
    return (result.return_value if result else None), execs


def test_rq_takes_one_clusters_prefix_a_process_and_refuses_another() -> None:
    """RQ builds its keys from a prefix read once, at import: this process's is the test
    cluster's, and a slot queue of another cluster is refused with both named."""
    from sluice.errors import ConfigError
    from sluice.store.rq_keys import bind, bound_prefix

    assert bound_prefix() == Keys(RQ_PREFIX).rq_prefix == "{trq:rq}"
    bind(Keys(RQ_PREFIX))  # the same again: fine
    with pytest.raises(ConfigError, match=r"under '\{trq:rq\}'.*prefix 'other' keeps them under '\{other:rq\}'"):
        SlotQueues(EventLog(connect("redis://127.0.0.1:1", check=False), Keys("other")), "tm-1")


def test_every_key_and_channel_a_slot_queue_and_its_worker_use_is_under_the_clusters_pattern(
    log: EventLog, redis_url: str
) -> None:
    """As an ACL user allowed only ``{trq:*`` keys and channels (and the commands the docs
    list), a task is queued, run, queued and cancelled, RQ is suspended and resumed, and a
    worker is sent a command: Redis refuses none of it (its ACL LOG stays empty)."""
    from urllib.parse import urlsplit, urlunsplit

    from rq.command import send_shutdown_command
    from rq.serializers import JSONSerializer
    from rq.suspension import resume, suspend

    from sluice.store.acl import acl_rules, check_access
    from sluice.store.slots import slot_worker_class

    admin = log.backend.client  # type: ignore[attr-defined]
    user = "slots-acl"
    admin.execute_command("ACL", "SETUSER", user, "reset", "on", ">pw", *acl_rules(log.keys).split())
    admin.execute_command("ACL", "LOG", "RESET")
    parts = urlsplit(redis_url)
    url = urlunsplit((parts.scheme, f"{user}:pw@{parts.hostname}:{parts.port}", parts.path, "", ""))
    client = connect(url)
    try:
        check_access(client, log.keys, url)
        as_user = EventLog(client, log.keys)
        queues = SlotQueues(as_user, "tm-acl")
        inbox = log.keys.inbox(log.keys.job("j1"))
        queues.enqueue(
            0, "tools.bench.tasks.noop", (), job_id="acl-1", description="t", before=[(inbox, env(heartbeat()))]
        )
        queue = Queue(log.keys.slot_queue("tm-acl", 0), connection=client, serializer=JSONSerializer)
        worker = slot_worker_class()([queue], name="w-acl", connection=client, serializer=JSONSerializer)
        worker.work(burst=True, with_scheduler=False, logging_level="WARNING")
        assert Job.fetch("acl-1", connection=client).get_status() == JobStatus.FINISHED
        queues.enqueue(0, "tools.bench.tasks.noop", (), job_id="acl-2", description="t")
        assert not queues.started("acl-2")
        queues.cancel("acl-2")
        assert Job.fetch("acl-2", connection=client).get_status() == JobStatus.CANCELED
        suspend(client)
        resume(client)
        send_shutdown_command(client, "w-acl")  # RQ's worker commands: a channel under the pattern
        assert admin.execute_command("ACL", "LOG") == []
    finally:
        client.close()
        admin.execute_command("ACL", "DELUSER", user)
