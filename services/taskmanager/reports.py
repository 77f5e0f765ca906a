"""What a TaskManager tells others: reports to jobs, owed until sent; messages to the
leader; and the final states of its tasks, kept until the leader confirms them.

``JobReports`` holds the reports not yet sent (Redis was away, or an inbox refused one)
and sends them, in order, in one round trip; ``LeaderMessages`` sends to the cluster inbox;
``FinalStates`` is the part of every slot report that a lost report cannot lose. Each is
built from the log, the world and the logger, never from the TaskManager.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from typing import Any

from sluice.errors import PartlyAppended, RedisUnavailable, WrongType
from sluice.events import (
    FIELD,
    AttemptReport,
    CancelTask,
    Envelope,
    Event,
    TaskState,
    UpdateTaskExecutionState,
    encode,
)
from sluice.services.common.metrics import TaskManagerMetrics
from sluice.services.common.world import World, monotonic_ms
from sluice.store import EventLog
from sluice.store.consumer import dead_letter

from .tasks import Task

__all__ = ["JobReports", "LeaderMessages", "FinalStates", "REFUSED_FOR_MS", "REMEMBERED", "task_state", "cancelled"]

REFUSED_FOR_MS = 30_000
"""How long a report whose inbox refuses it stays owed before it is parked, in milliseconds
(an inbox whose key holds another kind of value is moved aside at once: refused, the key
was written again)."""
REMEMBERED = 10_000  # inbox entries remembered as handled, and final states kept unconfirmed
_REPORTED_ERROR = 2_000  # characters of a failure kept in the slot report


def task_state(task: Task, state: TaskState, resource_id: str, error: str | None = None) -> UpdateTaskExecutionState:
    """``task`` is in ``state`` on the TaskManager ``resource_id``, in its slot."""
    d = task.descriptor
    return UpdateTaskExecutionState(
        d.job_id, d.execution_id, state, error, d.vertex, d.subtask, d.attempt, resource_id, task.slot
    )


def cancelled(msg: CancelTask, resource_id: str) -> UpdateTaskExecutionState:
    """The CANCELED report of a task ``msg`` cancels that is not here."""
    try:
        vertex, subtask, attempt = msg.execution_id.rsplit(":", 2)
        return UpdateTaskExecutionState(
            msg.job_id,
            msg.execution_id,
            TaskState.CANCELED,
            None,
            vertex,
            int(subtask),
            int(attempt),
            resource_id,
            None,
        )
    except ValueError:
        return UpdateTaskExecutionState(msg.job_id, msg.execution_id, TaskState.CANCELED)


class JobReports:
    """Reports to jobs. A report is owed until it is sent: one that fails (Redis away) is
    sent at the next flush, before anything else, so none is lost (one may arrive twice:
    the leader ignores a repeated report)."""

    def __init__(self, log: EventLog, world: World, logger: Any, metrics: TaskManagerMetrics) -> None:
        self.log, self.world, self.logger, self.metrics = log, world, logger, metrics
        self.owed: deque[tuple[str, Envelope]] = deque()
        """Reports to jobs not yet sent (Redis was away): sent, in order, before anything else."""
        self.refused_since: dict[str, int] = {}
        """Owed reports whose inbox refused them (not a stream), by envelope id: since when."""

    def to_job(self, job_id: str, message: Event, *, flush: bool = True) -> None:
        """Report to a job. ``flush=False``: only queue it (inside a step of starting a task,
        where a Redis error must not fail the start)."""
        keys = self.log.keys
        self.owed.append(
            (keys.inbox(keys.job(job_id)), Envelope(message, self.world.new_id(), 0, self.world.now_ms(), job_id))
        )
        if flush:
            self.flush()

    def flush(self) -> None:
        """Send every report owed in one round trip (a task's start owes two: the SubmitTask's
        result and INITIALIZING). When the round trip fails they all stay owed and go again,
        some maybe twice: the leader ignores a repeated report.

        An inbox whose key holds another kind of value is moved aside first (EventLog). A
        report refused all the same (the key was written again at once) stays owed and the
        others go. One refused for REFUSED_FOR_MS is parked in its job's dead letters with
        the reason; a final state also travels in every slot report until the leader has it."""
        if not self.owed:
            return
        sent = list(self.owed)
        try:
            self.log.append_each(sent)
            refused: dict[int, str] = {}
        except PartlyAppended as exc:
            refused = exc.errors
        now = monotonic_ms(self.world)  # how long a report has been refused: a timeout, on this process's clock
        kept: deque[tuple[str, Envelope]] = deque()
        parked: list[tuple[str, Envelope, str]] = []
        for i, (stream, env) in enumerate(sent):
            error = refused.get(i)
            if error is None:
                self.refused_since.pop(env.id, None)
                continue
            since = self.refused_since.setdefault(env.id, now)
            if now - since >= REFUSED_FOR_MS:
                parked.append((stream, env, error))
                continue
            if since == now:
                self.logger.warning(
                    "a report was refused; it stays owed", stream=stream, report=env.type, error=error[:300]
                )
            kept.append((stream, env))
        self.owed = kept
        self.metrics.appended((env.type for i, (_, env) in enumerate(sent) if i not in refused), "inbox")
        for n, (stream, env, error) in enumerate(parked):
            try:
                self._park(stream, env, error)
            except RedisUnavailable:
                self.owed.extend((s, e) for s, e, _ in parked[n:])
                raise

    def _park(self, stream: str, env: Envelope, error: str) -> None:
        self.refused_since.pop(env.id, None)
        reason = (
            f"undeliverable: {stream!r} refused the report for {REFUSED_FOR_MS // 1000} s ({error}); "
            "the report stays here"
        )
        try:
            dead_letter(self.log, stream, "", env.id, {FIELD: encode(env)}, "undeliverable", reason)
        except RedisUnavailable:
            raise
        except Exception as again:  # its job's dead letters refuse it too: the log line keeps it
            self.logger.error(
                "a refused report could not be parked; it is dropped",
                stream=stream,
                report=encode(env).decode(),
                error=str(again)[:300],
            )
            return
        self.metrics.parked("undeliverable")
        self.logger.error(
            "a report refused for too long was parked in its job's dead letters",
            stream=stream,
            report=env.type,
            error=error[:300],
        )


class LeaderMessages:
    """Messages to the leader, through the cluster inbox."""

    def __init__(self, log: EventLog, world: World, logger: Any, metrics: TaskManagerMetrics) -> None:
        self.log, self.world, self.logger, self.metrics = log, world, logger, metrics
        self.stream = log.keys.inbox(log.keys.cluster)

    def send(self, message: Event, cause: str | None = None) -> bool:
        """A message to the leader; whether it went. One the cluster inbox refuses (its key
        holds another kind of value again right after it was moved aside) is dropped with a
        warning: registration sends again when unanswered, and heartbeats come again."""
        try:
            self.log.append(self.stream, Envelope(message, self.world.new_id(), 0, self.world.now_ms(), None, cause))
        except WrongType as exc:
            self.logger.warning("a message to the leader was refused", message=message.TYPE, error=str(exc)[:300])
            return False
        self.metrics.appended((message.TYPE,), "inbox")
        return True


class FinalStates:
    """Final states of tasks that ended here, kept (and listed in every slot report) until
    the leader confirms its log has them: a report lost on the way is not lost."""

    def __init__(self, on_end: Callable[[TaskState], None]) -> None:
        self.on_end = on_end
        """Told each final state as it is remembered (the metrics' count of ended tasks)."""
        self.by_task: OrderedDict[str, AttemptReport] = OrderedDict()

    def remember(self, task: Task, state: TaskState, error: str | None = None) -> None:
        """Remember a task's final state until the leader confirms it."""
        d = task.descriptor
        if error is not None and len(error) > _REPORTED_ERROR:  # the job's inbox has it whole; heartbeats stay small
            error = error[:_REPORTED_ERROR] + "\n… (truncated)"
        self.by_task[task.id] = AttemptReport(d.job_id, d.execution_id, state, error)
        self.on_end(state)
        while len(self.by_task) > REMEMBERED:
            self.by_task.popitem(last=False)

    def confirmed(self, task_ids: Iterable[str]) -> None:
        """The leader's log has these."""
        for tid in task_ids:
            self.by_task.pop(tid, None)

    def clear(self) -> None:
        self.by_task.clear()

    def forget_jobs(self, job_ids: set[str]) -> None:
        """Forget the final states of these jobs' tasks (their shard failed over: the leader
        runs their unfinished attempts again, renumbered)."""
        for tid in [tid for tid, r in self.by_task.items() if r.job_id in job_ids]:
            del self.by_task[tid]

    def reports(self) -> list[AttemptReport]:
        return list(self.by_task.values())

    def __len__(self) -> int:
        return len(self.by_task)
