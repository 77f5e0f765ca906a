"""The RQ queues of TaskManager slots: one queue per slot, one SimpleWorker process per
queue, JSON payloads (never pickle). RQ is a Redis library, so it lives here with the
rest of what talks to Redis."""

from __future__ import annotations

from typing import Any

from .log import EventLog
from .redis_backend import RedisBackend, translate_errors

__all__ = ["SlotQueues", "work_slot"]


def _client(log: EventLog) -> Any:
    if not isinstance(log.backend, RedisBackend):
        raise TypeError("slot queues need a Redis backend (RQ runs on Redis)")
    return log.backend.client


class SlotQueues:
    """Enqueue a task for a slot's worker, cancel it, ask whether the worker took it."""

    def __init__(self, log: EventLog, resource_id: str) -> None:
        self.log, self.resource_id = log, resource_id
        self._queues: dict[int, Any] = {}

    def enqueue(self, slot: int, func: str, args: tuple[Any, ...], *, job_id: str, description: str) -> str:
        from rq import Queue
        from rq.serializers import JSONSerializer

        q = self._queues.get(slot)
        if q is None:
            q = self._queues[slot] = Queue(self.log.keys.slot_queue(self.resource_id, slot),
                                           connection=_client(self.log), serializer=JSONSerializer)
        with translate_errors(f"queueing a task for slot {slot}"):
            job = q.enqueue(func, args=args, job_id=job_id, job_timeout=-1, result_ttl=600, failure_ttl=3600,
                            description=description)
        return str(job.id)

    def cancel(self, rq_job: str) -> None:
        """Take a queued task out of its queue (a no-op once a worker runs it or it is gone)."""
        from rq.job import Job

        try:
            Job.fetch(rq_job, connection=_client(self.log)).cancel()
        except Exception:  # gone, already finished, or Redis away: nothing to cancel
            pass

    def started(self, rq_job: str) -> bool:
        """Whether a worker took the task off its queue (True when unknown: assume it runs)."""
        from rq.job import Job, JobStatus

        try:
            return bool(Job.fetch(rq_job, connection=_client(self.log)).get_status() != JobStatus.QUEUED)
        except Exception:
            return True


def work_slot(log: EventLog, resource_id: str, slot: int) -> None:
    """Run one slot's RQ SimpleWorker until it is stopped (no fork per job: a Spark session
    must never be forked, so it and the job's imported code stay warm across tasks)."""
    from rq import Queue, SimpleWorker
    from rq.serializers import JSONSerializer

    client = _client(log)
    queue = Queue(log.keys.slot_queue(resource_id, slot), connection=client, serializer=JSONSerializer)
    SimpleWorker([queue], connection=client, serializer=JSONSerializer).work(with_scheduler=False,
                                                                            logging_level="WARNING")
