"""The RQ queues of TaskManager slots: one queue per slot, one SimpleWorker process per
queue, JSON payloads (never pickle). RQ is a Redis library, so it lives here with the
rest of what talks to Redis.

RQ's keys are under the cluster's prefix (``{<p>:rq}:…``, ``store/rq_keys.py``). They may
live on a Redis of their own (``$SLUICE_RQ_REDIS_URL``): RQ is not cluster-safe
(rq/rq#1942), so when the log is on a Redis Cluster the queues stay on a single node. By
default they are on the log's Redis."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

from sluice.errors import ConfigError, RedisUnavailable
from sluice.events import FIELD, Envelope, encode

from .connection import RQ_URL_ENV, Outage
from .log import EventLog
from .redis_backend import RedisBackend, translate_errors
from .rq_keys import bind

__all__ = [
    "SlotQueues",
    "work_slot",
    "slot_worker_class",
    "put_back_lost",
    "HEARTBEAT_EVERY_S",
    "DEQUEUE_TIMEOUT_S",
    "LOST_CHECK_EVERY_S",
]

HEARTBEAT_EVERY_S = 1.0
"""A slot's worker renews its RQ registration at most this often. RQ renews it before and
after each dequeue and after each job: three times a job, three round trips each, for a
key that lives for minutes (``worker_ttl``). With no-op tasks that was a fifth of a
worker's CPU (``scripts/bench tasks``)."""


DEQUEUE_TIMEOUT_S = 10
"""How long an idle slot worker's BLMOVE waits for a task before it looks again (RQ's
default is its ``worker_ttl`` less 15 s: 405 s). Between two waits the worker puts back the
tasks its lost dequeues left in the queue's intermediate list (``put_back_lost``), so a task
taken by a BLMOVE whose reply never came waits at most about this long. Below
``store.connection.SOCKET_TIMEOUT_S``: the wait is not mistaken for a dead connection."""

LOST_CHECK_EVERY_S = 5.0
"""An idle or busy slot worker looks for lost dequeues at most this often (one LRANGE)."""

# KEYS[1]: a queue's intermediate list, KEYS[2]: the queue; ARGV[1]: a job id. The job goes
# back to the head of its queue only if it was still in the intermediate list (so never twice).
PUT_BACK = """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then
    redis.call('LPUSH', KEYS[2], ARGV[1])
    return 1
end
return 0
"""


def put_back_lost(queue: Any) -> list[str]:
    """Put the tasks a lost dequeue left in ``queue``'s intermediate list back at its head;
    their ids. Only its own worker calls this, between two dequeues: RQ moves a task from
    the queue to the intermediate list with BLMOVE, and the transaction that starts it takes
    it out of the list and into the started registry, so a task still in the list then was
    taken by a BLMOVE whose reply never reached this worker. That happens when the worker's
    address changes (a container connected again to its network): Redis serves the BLMOVE
    still pending on the old connection, which it holds open until TCP tells it otherwise,
    and the reply goes nowhere. A task no longer queued (cancelled, or gone) only leaves the
    list. RQ's own clean-up (``IntermediateQueue.cleanup``, every ten minutes) would fail
    such a task after a minute instead; nothing would report that to Sluice."""
    from rq.job import Job, JobStatus

    connection = queue.connection
    intermediate = queue.intermediate_queue
    ids = intermediate.get_job_ids()
    if not ids:
        return []
    started = set(queue.started_job_registry.get_job_ids(cleanup=False))
    put_back = connection.register_script(PUT_BACK)
    back: list[str] = []
    for job_id in ids:
        if job_id in started:
            continue  # RQ's own bookkeeping (a worker of several queues): left to RQ
        status = Job(job_id, connection=connection).get_status(refresh=True) if Job.exists(job_id, connection) else None
        if status == JobStatus.QUEUED:
            if put_back(keys=[intermediate.key, queue.key], args=[job_id]):
                back.append(job_id)
        else:
            intermediate.remove(job_id)
    return back


def _client(log: EventLog, rq: Any = None) -> Any:
    """RQ's Redis: ``rq`` (a redis-py client of a single-node Redis), or the log's own."""
    if rq is not None:
        return rq
    if not isinstance(log.backend, RedisBackend):
        raise ConfigError(
            f"RQ's slot queues need a single-node Redis, and this log is on a {type(log.backend).__name__}: "
            f"set ${RQ_URL_ENV} (RQ is not cluster-safe)"
        )
    return log.backend.client


class SlotQueues:
    """Enqueue a task for a slot's worker, cancel it, ask whether the worker took it.
    ``rq``: a client of the Redis that holds RQ's queues when it is not the log's."""

    def __init__(self, log: EventLog, resource_id: str, *, rq: Any = None) -> None:
        bind(log.keys)
        self.log, self.resource_id, self._rq = log, resource_id, rq
        self._queues: dict[int, Any] = {}

    @property
    def client(self) -> Any:
        """The client of RQ's Redis."""
        return self._rq if self._rq is not None else _client(self.log)

    def enqueue(
        self,
        slot: int,
        func: str,
        args: tuple[Any, ...],
        *,
        job_id: str,
        description: str,
        before: Sequence[tuple[str, Envelope]] = (),
    ) -> str:
        """Queue ``func(*args)`` for the slot's worker as RQ job ``job_id``. ``before``:
        messages appended to their streams first, in the same transaction (one MULTI/EXEC, one
        round trip): the worker cannot take the job before they are in, and the server applies
        all or nothing. (A connection lost after EXEC leaves the outcome unknown: ``exists``
        tells.) If Redis refuses one of them (its key is not a stream), the job is taken back
        out of its queue and the error raised; but if the slot's worker took it already (an
        idle worker is woken by the push itself), it is handed over and its id returned.

        With RQ on a Redis of its own the messages are appended first, then the job queued
        (two round trips): still in that order, but no longer all or nothing (the messages may
        be in with no job queued; the caller hands the task over again, and a repeated report
        is ignored)."""
        import redis
        from rq import Queue
        from rq.serializers import JSONSerializer

        client = self.client
        q = self._queues.get(slot)
        if q is None:
            q = self._queues[slot] = Queue(
                self.log.keys.slot_queue(self.resource_id, slot), connection=client, serializer=JSONSerializer
            )
        if self._rq is not None and before:  # RQ on a Redis of its own: the messages first
            self.log.append_each(before)
            before = ()
        with translate_errors(f"queueing a task for slot {slot}"), client.pipeline(transaction=True) as pipe:
            pipe.multi()  # explicit, so that RQ adds its commands to this transaction
            for stream, env in before:
                pipe.xadd(stream, {FIELD: encode(env)})
            # No depends_on, ever: a slot's worker records a task's outcome without looking
            # for dependents to release (``slot_worker_class``), and this is the only producer.
            job = q.enqueue(
                func,
                args=args,
                job_id=job_id,
                job_timeout=-1,
                result_ttl=600,
                failure_ttl=3600,
                description=description,
                pipeline=pipe,
            )
            replies = pipe.execute(raise_on_error=False)
        errors = [r for r in replies if isinstance(r, redis.ResponseError)]
        if errors:  # the transaction queued the job all the same
            with translate_errors(f"taking a task back out of the queue of slot {slot}"):
                if q.remove(job.id):  # still queued: no worker has it, so it never runs
                    job.cancel()
                    raise errors[0]
        return str(job.id)

    def exists(self, rq_job: str) -> bool:
        """Whether the task was queued (it stays known for a while after it ran)."""
        from rq.job import Job

        with translate_errors(f"looking for task {rq_job}"):
            return bool(Job.exists(rq_job, connection=self.client))

    def cancel(self, rq_job: str) -> None:
        """Take a queued task out of its queue (a no-op once a worker runs it or it is gone)."""
        from rq.job import Job

        try:
            Job.fetch(rq_job, connection=self.client).cancel()
        except Exception:  # gone, already finished, or Redis away: nothing to cancel
            pass

    def started(self, rq_job: str) -> bool:
        """Whether a worker took the task off its queue (True when unknown: assume it runs)."""
        from rq.job import Job, JobStatus

        try:
            return bool(Job.fetch(rq_job, connection=self.client).get_status() != JobStatus.QUEUED)
        except Exception:
            return True


def slot_worker_class(outage: Outage | None = None) -> Any:
    """The RQ SimpleWorker class of a slot: it waits through a Redis outage (``outage``),
    renews its registration and asks whether `rq suspend` was called at most every
    ``HEARTBEAT_EVERY_S``, and writes its state only when it changed. RQ alone spends about
    ten round trips on a task, five of them on those, and one more on a job's heartbeat that the
    next transaction writes again (``scripts/bench tasks``: a worker's CPU a no-op task went
    from RQ's 3.5 ms to 2.7 ms with the suspension check and the state write)."""
    import redis
    from rq import Queue, SimpleWorker
    from rq.executions import Execution
    from rq.job import JobStatus
    from rq.rate_limit import release_slot
    from rq.utils import now as rq_now
    from rq.worker import WorkerStatus

    def through_outage(call: Callable[[], object]) -> None:
        """``call()``; once more after waiting for Redis if it was away (without ``outage``: raise)."""
        try:
            call()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if outage is None:
                raise
            outage.wait(exc)
            call()

    def recent(at: float | None) -> bool:
        """Whether ``at`` (a monotonic time, None: never) is within ``HEARTBEAT_EVERY_S``."""
        return at is not None and time.monotonic() - at < HEARTBEAT_EVERY_S

    class SlotWorker(SimpleWorker):
        stopping = False
        beat_at: float | None = None
        asked_at: float | None = None
        looked_at: float | None = None
        waiting = False
        held: Any = None
        written: str | None = None
        put_back: tuple[str, ...] = ()
        """The tasks it put back (``put_back_lost``), for logs and tests."""

        @property
        def dequeue_timeout(self) -> int:
            """A short wait for a task (RQ: 405 s), so that lost dequeues are looked for
            between two waits (``DEQUEUE_TIMEOUT_S``)."""
            return DEQUEUE_TIMEOUT_S

        def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> Any:
            self.waiting = True
            try:
                return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
            finally:
                self.waiting = False

        @property
        def should_run_maintenance_tasks(self) -> bool:
            """RQ's maintenance every ten minutes (``maintenance_interval``), and the look for
            lost dequeues: RQ asks before each dequeue, and again at each pass of its wait for
            a task, which comes after a wait that timed out or a connection that broke (when
            a lost reply is likeliest): then at most once a second, else every
            ``LOST_CHECK_EVERY_S`` (between short tasks)."""
            every = 1.0 if self.waiting else LOST_CHECK_EVERY_S
            due = self.looked_at is None or time.monotonic() - self.looked_at >= every
            return due or bool(super().should_run_maintenance_tasks)

        def run_maintenance_tasks(self) -> None:
            """Put back what lost dequeues left in the intermediate list (``put_back_lost``),
            then RQ's own maintenance when it is due. An outage met here is waited through."""
            through_outage(self.put_back_lost)
            self.looked_at = time.monotonic()
            if super().should_run_maintenance_tasks:
                through_outage(lambda: super(SlotWorker, self).run_maintenance_tasks())  # type: ignore[no-untyped-call]  # rq leaves it unannotated

        def put_back_lost(self) -> None:
            for queue in self.queues:
                back = put_back_lost(queue)
                if back:
                    self.put_back = (*self.put_back, *back)
                    self.log.warning(
                        "Worker %s: put back %s, taken off %s by a dequeue whose reply was lost",
                        self.name,
                        ", ".join(back),
                        queue.name,
                    )

        def request_stop(self, signum: Any, frame: Any) -> None:
            self.stopping = True
            super().request_stop(signum, frame)  # type: ignore[no-untyped-call]  # rq leaves it unannotated

        def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> Any:
            """RQ calls this first after a failed wait for a task and after each task: the
            place to wait through an outage (RQ would retry every few seconds, a log line
            each time, or end its loop). A renewal of its own (not part of one of RQ's
            transactions) within ``HEARTBEAT_EVERY_S`` of the last is skipped."""
            if pipeline is not None:
                return super().heartbeat(timeout, pipeline)
            if timeout is None and recent(self.beat_at):
                return None
            through_outage(lambda: super(SlotWorker, self).heartbeat(timeout))
            self.beat_at = time.monotonic()
            return None

        def check_for_suspension(self, burst: bool) -> None:
            """RQ asks whether `rq suspend` was called before each dequeue (one round trip,
            with a renewal); a slot's worker asks at most every ``HEARTBEAT_EVERY_S``: a
            suspension stops it from taking new tasks within a second. An outage met here is
            waited through (RQ would end its loop)."""
            if recent(self.asked_at):
                return
            through_outage(lambda: super(SlotWorker, self).check_for_suspension(burst))
            self.asked_at = time.monotonic()

        def set_state(self, state: str, pipeline: Any = None) -> None:
            """RQ writes the worker's state (idle, busy) after each task and again before each
            dequeue: the second write of a state it already wrote is skipped. A write of its
            own (not in one of RQ's transactions) is RQ's first call to Redis after a task:
            an outage met there is waited through."""
            if pipeline is not None:
                super().set_state(state, pipeline)
                self.written = None  # known once the transaction ran; written again if unsure
                return
            if state == self.written and state == self.get_state():
                return
            through_outage(lambda: super(SlotWorker, self).set_state(state))
            self.written = state

        def prepare_execution(self, job: Any) -> Any:
            """RQ records a task's execution in a transaction of its own, then the task's start
            in another one right after (``prepare_job_execution``): here the first is held and
            sent with the second, one round trip."""
            self.held = pipeline = self.connection.pipeline()
            execution = Execution.create(job, self.get_heartbeat_ttl(job), pipeline=pipeline, worker_name=self.name)
            self.executions[execution.id] = execution
            self.set_state(WorkerStatus.BUSY, pipeline=pipeline)
            return execution

        def prepare_job_execution(self, job: Any, remove_from_intermediate_queue: bool = False) -> None:
            """The task's start, as RQ writes it, with the execution held above."""
            pipeline, self.held = self.held or self.connection.pipeline(), None
            with pipeline:
                ttl = self.get_heartbeat_ttl(job)
                # RQ renews the registration for worker_ttl + 60 s before each dequeue, which is
                # skipped within a second: a task's renewal must not leave it shorter.
                self.heartbeat(max(ttl, self.worker_ttl + 60), pipeline=pipeline)
                job.heartbeat(rq_now(), ttl, pipeline=pipeline)
                job.prepare_for_execution(self.name, pipeline=pipeline)
                pipeline.persist(job.key)
                if remove_from_intermediate_queue:
                    pipeline.lrem(Queue(job.origin, connection=self.connection).intermediate_queue_key, 1, job.id)
                pipeline.execute()
            # rq leaves procline unannotated (and the config cannot exempt a method reached through self)
            self.procline(f"Processing {job.func_name} from {job.origin} since {time.time()}")  # type: ignore[no-untyped-call]

        def handle_execution_ended(self, job: Any, queue: Any, heartbeat_ttl: int) -> None:
            """RQ stamps a job's end and writes its heartbeat in a round trip of its own; the
            transaction that records the outcome, right after, writes the job's whole hash
            again (success and failure alike): the stamps are left to it."""
            job.ended_at = job.last_heartbeat = rq_now()

        def handle_job_success(self, job: Any, queue: Any, started_job_registry: Any, execution: Any) -> None:
            """Record a task that returned, as RQ does (result, registries, counters), in one
            transaction. RQ first watches the job's dependents and reads them, two round trips
            more, to enqueue the jobs that waited on it: a slot's task has none (its id is a
            fresh handle only its TaskManager knows). A repeating job goes RQ's way."""
            if job.repeats_left:
                super().handle_job_success(job, queue, started_job_registry, execution)
                return
            with self.connection.pipeline() as pipeline:
                self.increment_successful_job_count(pipeline=pipeline)
                self.increment_total_working_time(job.ended_at - job.started_at, pipeline)
                result_ttl = job.get_result_ttl(self.default_result_ttl)
                if result_ttl != 0:
                    job._handle_success(
                        result_ttl,
                        pipeline=pipeline,
                        worker_name=self.name,
                        execution_id=execution.id,
                        execution_started_at=execution.created_at,
                        execution_ended_at=job.ended_at,
                    )
                job.cleanup(result_ttl, pipeline=pipeline, remove_from_queue=False)
                job._status = JobStatus.FINISHED
                self.cleanup_execution(job, pipeline=pipeline, execution=execution)
                pipeline.execute()
            release_slot(job)

        def _pubsub_exception_handler(self, exc: Exception, pubsub: Any, pubsub_thread: Any) -> None:
            """RQ's command listener retries every 2 s while Redis is away, with a log line
            each time; it retries quietly here (the worker's main loop says it once)."""
            if outage is not None and isinstance(exc, redis.ConnectionError):
                time.sleep(2.0)
                return
            super()._pubsub_exception_handler(exc, pubsub, pubsub_thread)

    return SlotWorker


def work_slot(log: EventLog, resource_id: str, slot: int, *, outage: Outage | None = None, rq: Any = None) -> None:
    """Run one slot's RQ SimpleWorker until it is stopped (no fork per job: a Spark session
    must never be forked, so it and the job's imported code stay warm across tasks). It is
    named for its TaskManager and slot (``Keys.slot_worker``), as ``rq info`` lists it.

    RQ's own bookkeeping (its heartbeat, a job's status after the task ran) ends its loop
    when Redis is away. With ``outage``, the worker then waits for Redis and works on, in
    the same process: a task that finished keeps its result (it reported it itself), and
    the slot's worker does not die (its TaskManager would count that as a task failure).
    ``rq``: a client of the Redis that holds RQ's queues when it is not the log's.
    """
    bind(log.keys)  # before RQ is imported: it reads its prefix then
    import redis
    from rq import Queue
    from rq.exceptions import StopRequested
    from rq.serializers import JSONSerializer

    SlotWorker = slot_worker_class(outage)

    client = rq if rq is not None else _client(log)
    queue = Queue(log.keys.slot_queue(resource_id, slot), connection=client, serializer=JSONSerializer)
    # RQ lists a queue (and, once any queue is listed, only the workers of listed queues)
    # after its first job: name it in RQ's set of queues now, so `rq info` shows the slot and
    # its worker from the start.
    client.sadd(Queue.redis_queues_keys, queue.key)
    quick_ends = incarnation = 0
    while True:
        incarnation += 1  # a new name each time: the last one's registration may outlive it
        name = log.keys.slot_worker(resource_id, slot, socket.gethostname(), os.getpid(), incarnation)
        worker = SlotWorker([queue], name=name, connection=client, serializer=JSONSerializer)
        began = time.monotonic()
        try:
            worker.work(with_scheduler=False, logging_level="WARNING")
        except StopRequested:
            return
        except (redis.ConnectionError, redis.TimeoutError, RedisUnavailable):
            pass  # its teardown could not reach Redis either
        if worker.stopping or outage is None:
            return
        try:
            if outage.wait() > 0:
                quick_ends = 0
                continue
        except StopRequested:
            return
        if time.monotonic() - began > 60:  # it worked a while: not one of a run of quick ends
            quick_ends = 0
        quick_ends += 1  # Redis answers: RQ's loop ended for another reason (or Redis blinked: a
        # connection broken by keepalive where RQ does not catch it, say its bookkeeping after a task)
        if quick_ends > 3:
            raise RuntimeError(f"the RQ worker of slot {slot} keeps ending while Redis answers; see its log above")
        time.sleep(0.5 * quick_ends)
