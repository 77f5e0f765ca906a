"""Speculative execution, pure: a second attempt of a subtask that runs well past its
vertex's median, and the first of them to finish wins (Flink's SpeculativeScheduler and
ExecutionTimeBasedSlowTaskDetector, FLIP-168).

Off by default (``SpeculationConfig.enabled``, as Flink's
``execution.batch.speculative.enabled``): with it off, nothing here runs and the jobs core
decides as it always did.

- **Which vertices**: those without an operator coordinator. A source's coordinator hands
  each split to one attempt; a speculative source would have to read the splits its
  original was given, in the same order, and share what either asks for next (Flink's
  FLIP-245): not built yet, so a source is never speculated. Nor is a vertex with another
  coordinator (its events go to one attempt) or with queryable state (its registration
  names one attempt's state server).
- **Detection** (``slow_attempts``), on each tick (``Speculate``): once a share
  ``baseline_ratio`` of a vertex's subtasks finished (Flink's
  ``slow-task-detector.execution-time.baseline-ratio``, 0.75), its baseline is the median
  of their execution times times ``baseline_multiplier`` (``…baseline-multiplier``, 1.5),
  and never less than ``baseline_lower_bound_ms`` (``…baseline-lower-bound``, one minute).
  An attempt deployed longer ago than the baseline is slow. An execution time runs from
  the attempt's deployment (as Flink's does) to its end, or to now.
- **A speculative attempt** (``SpeculativeAttemptScheduled``) of a slow subtask, numbered
  above every attempt its subtask had, waits in the job's ready queue and is placed by the
  scheduler on a TaskManager other than the ones its subtask's attempts run on (``avoid``).
  At most ``max_concurrent`` attempts of a subtask run at once (Flink's
  ``execution.batch.speculative.max-concurrent-executions``, 2). Only when such a
  TaskManager has a free slot: a single TaskManager gains nothing from it.
- **The winner** (``AttemptWon``) is the first attempt to complete its partition or to
  finish: it becomes the subtask's current attempt, and the others are cancelled. So
  consumers, which read the current attempts' partitions, read only the winner's; the
  losers' outputs, published per attempt, are never read and are swept with their attempt.
  An attempt that fails while another of its subtask runs is not restarted: the other one
  carries on (it wins if the failed one was current).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from sluice.events import (
    AttemptWon,
    CancelTask,
    ScheduleOrUpdateConsumers,
    SpeculativeAttemptScheduled,
    TaskOperationResult,
    TaskState,
    UpdateTaskExecutionState,
)
from sluice.services.common.decision import Address, Decision
from sluice.services.coordination.runtime import has_coordinator

from .machine import LIVE_JOB, LIVE_TASK, REPORTED, UNDEPLOYED_TASK
from .recorder import Recorder
from .speculation_config import SpeculationConfig
from .state import Execution, JobRun, JobsState, parse_execution_id

__all__ = [
    "SpeculationConfig",
    "Speculate",
    "Slow",
    "speculate",
    "slow_attempts",
    "execution_time",
    "avoid",
    "concurrent_message",
    "concurrent_failure",
    "next_attempt",
    "any_concurrent",
    "beside",
    "drop",
]

_RUNNING = frozenset({TaskState.DEPLOYING, TaskState.INITIALIZING, TaskState.RUNNING})


@dataclass(frozen=True)
class Speculate:
    """Time passed: start a speculative attempt of each slow subtask of job ``job_id``
    that can have one on a TaskManager with a free slot (``free``: free slots by TaskManager)."""

    job_id: str
    config: SpeculationConfig
    free: dict[str, list[int]]


@dataclass(frozen=True)
class Slow:
    """A slow attempt: it ran ``elapsed_ms``, past its vertex's ``baseline_ms``."""

    execution: Execution
    elapsed_ms: int
    baseline_ms: int


def execution_time(ex: Execution, now: int) -> int | None:
    """How long attempt ``ex`` ran, from its deployment to its end (or to ``now``); None when
    its story no longer tells when it was deployed."""
    deployed = f"{ex.attempt}: {TaskState.SCHEDULED.value}->{TaskState.DEPLOYING.value}"
    at = next((ts for ts, what in reversed(ex.history) if what.startswith(deployed)), None)
    if at is None:
        return None
    end = ex.since if ex.state == TaskState.FINISHED else now
    return max(0, end - at)


def slow_attempts(job: JobRun, now: int, config: SpeculationConfig) -> list[Slow]:
    """The job's current attempts that are slow at ``now`` (see the module's docstring), in
    the graph's order."""
    slow: list[Slow] = []
    for vertex in job.vertices.values():
        if has_coordinator(vertex.spec) or vertex.spec.queryable:
            continue  # a coordinator's events and a queryable state's registration go to one attempt
        times = [
            t for ex in vertex.subtasks if ex.state == TaskState.FINISHED and (t := execution_time(ex, now)) is not None
        ]
        if not times or len(times) < math.ceil(config.baseline_ratio * len(vertex.subtasks)):
            continue
        baseline = max(int(statistics.median(times) * config.baseline_multiplier), config.baseline_lower_bound_ms)
        for ex in vertex.subtasks:
            if ex.state in _RUNNING and (t := execution_time(ex, now)) is not None and t > baseline:
                slow.append(Slow(ex, t, baseline))
    return slow


def avoid(job: JobRun, ex: Execution) -> frozenset[str]:
    """The TaskManagers a speculative attempt ``ex`` must not be placed on: those its
    subtask's other attempts run on (empty for a subtask's current attempt)."""
    vertex = job.vertices[ex.vertex]
    current = vertex.subtasks[ex.subtask]
    if current is ex or not vertex.concurrent:
        return frozenset()
    others = [current, *vertex.concurrent.get(ex.subtask, ())]
    return frozenset(o.taskmanager for o in others if o is not ex and o.taskmanager is not None)


def speculate(state: JobsState, s: Speculate, now: int) -> Decision:
    """A speculative attempt for each slow subtask of the job that has room for one."""
    rec = Recorder(state, s.job_id, now)
    job = state.jobs.get(s.job_id)
    if not s.config.enabled or job is None or job.status not in LIVE_JOB or not job.built:
        return rec.decision
    for slow in slow_attempts(job, now, s.config):
        ex = slow.execution
        vertex = job.vertices[ex.vertex]
        others = vertex.concurrent.get(ex.subtask, [])
        if 1 + len(others) >= s.config.max_concurrent or any(o.state == TaskState.CANCELING for o in others):
            continue  # (as many as may run, or a winner already decided)
        busy = {ex.taskmanager, *(o.taskmanager for o in others)}
        if not any(slots for tm, slots in s.free.items() if tm not in busy):
            rec.note(
                f"{ex.id} is slow ({slow.elapsed_ms} ms > {slow.baseline_ms} ms) but no other TaskManager has a free slot"
            )
            continue
        highest = max(ex.attempt, vertex.highest.get(ex.subtask, -1), *(o.attempt for o in others))
        rec.fact(
            SpeculativeAttemptScheduled(
                job.job_id,
                ex.vertex,
                ex.subtask,
                highest + 1,
                ex.attempt,
                slow.elapsed_ms,
                slow.baseline_ms,
                ex.taskmanager,
            )
        )
    return rec.decision


# --- the hooks of the jobs core: what a subtask with concurrent attempts does differently ----------


def any_concurrent(job: JobRun) -> bool:
    """Some subtask of the job has an attempt beside its current one (a race on, or a loser
    not yet stopped)."""
    return any(v.concurrent for v in job.vertices.values())


def next_attempt(job: JobRun, ex: Execution) -> int:
    """The number of ``ex``'s restart: above every attempt its subtask had (a speculative one too)."""
    return max(ex.attempt, job.vertices[ex.vertex].highest.get(ex.subtask, -1)) + 1


def beside(job: JobRun, ex: Execution) -> bool:
    """``ex`` runs beside its subtask's current attempt (a speculative attempt, or a loser)."""
    return job.vertices[ex.vertex].subtasks[ex.subtask] is not ex


def drop(rec: Recorder, ex: Execution, reason: str) -> None:
    """An attempt beside its subtask's current one ends, without a restart (the log restarted:
    the current attempt's restart replaces them all)."""
    if ex.state == TaskState.CANCELING or ex.state in UNDEPLOYED_TASK:
        rec.move(ex, TaskState.CANCELED, reason)
    elif not ex.state.terminal:
        rec.move(ex, TaskState.FAILED, reason)


def _win(rec: Recorder, job: JobRun, winner: Execution, why: str) -> None:
    """``winner`` wins over its subtask's other attempts: they are cancelled."""
    vertex = job.vertices[winner.vertex]
    current = vertex.subtasks[winner.subtask]
    losers = [o for o in [current, *vertex.concurrent.get(winner.subtask, ())] if o is not winner]
    rec.fact(AttemptWon(job.job_id, winner.vertex, winner.subtask, winner.attempt, [o.attempt for o in losers]))
    for loser in losers:
        if loser.state in UNDEPLOYED_TASK:
            rec.move(loser, TaskState.CANCELED)
        elif loser.state in LIVE_TASK:
            rec.move(loser, TaskState.CANCELING)
            reason = f"attempt {winner.attempt} of {winner.vertex}[{winner.subtask}] {why} first"
            rec.send(Address.taskmanager(loser.taskmanager or ""), CancelTask(job.job_id, loser.id, reason))


def _rival(job: JobRun, ex: Execution) -> Execution | None:
    """Another attempt of ``ex``'s subtask that still races it (not being cancelled, not over)."""
    vertex = job.vertices[ex.vertex]
    current = vertex.subtasks[ex.subtask]
    return next(
        (
            o
            for o in [current, *vertex.concurrent.get(ex.subtask, ())]
            if o is not ex and not o.state.terminal and o.state != TaskState.CANCELING
        ),
        None,
    )


def concurrent_message(
    rec: Recorder, job: JobRun, msg: UpdateTaskExecutionState | ScheduleOrUpdateConsumers | TaskOperationResult
) -> bool:
    """A message of an attempt whose subtask has concurrent attempts. The first to complete
    its partition or to finish wins (``AttemptWon``, then the message is handled as usual);
    a failed one is not restarted while another races it; a move of a non-current attempt
    (a speculative one, or a loser being cancelled) is recorded here. True: handled here."""
    try:
        vertex_name, subtask, _ = parse_execution_id(msg.execution_id)
        vertex = job.vertices[vertex_name]
    except (ValueError, KeyError):
        return False
    if subtask not in vertex.concurrent:
        return False
    ex = job.attempt_of(msg.execution_id)
    if ex is None:
        return False  # (stale: the usual handling says so)
    if job.status in LIVE_JOB and ex.state in LIVE_TASK:
        if isinstance(msg, ScheduleOrUpdateConsumers) or (
            isinstance(msg, UpdateTaskExecutionState) and msg.state == TaskState.FINISHED
        ):
            if _rival(job, ex) is not None:
                done = "completed its partition" if isinstance(msg, ScheduleOrUpdateConsumers) else "finished"
                _win(rec, job, ex, done)
            return False  # (current now: handled as usual)
        failed = (isinstance(msg, UpdateTaskExecutionState) and msg.state == TaskState.FAILED) or (
            isinstance(msg, TaskOperationResult)
            and not msg.success
            and ex.state in (TaskState.DEPLOYING, TaskState.INITIALIZING)
        )
        if failed:
            error = msg.error if isinstance(msg, UpdateTaskExecutionState) else f"deployment failed: {msg.message}"
            return concurrent_failure(rec, job, ex, error or "failed without an error message")
    if vertex.subtasks[subtask] is ex:
        return False
    if isinstance(msg, UpdateTaskExecutionState) and (ex.state, msg.state) in REPORTED:
        rec.move(ex, msg.state, msg.error)
    elif isinstance(msg, UpdateTaskExecutionState):
        rec.note(f"{msg.execution_id}: {ex.state.value} -> {msg.state.value} is not a legal move; ignored")
    elif isinstance(msg, ScheduleOrUpdateConsumers):
        rec.note(f"{msg.execution_id} completed its partition, but it lost its race: consumers do not read it")
    return True


def concurrent_failure(rec: Recorder, job: JobRun, ex: Execution, error: str) -> bool:
    """Attempt ``ex`` failed while another attempt of its subtask races it, or it runs beside
    its subtask's current attempt: it is not restarted; the other carries on (and becomes
    current, if ``ex`` was). True: so handled (False: the usual failure follows)."""
    vertex = job.vertices[ex.vertex]
    if not vertex.concurrent or job.status not in LIVE_JOB:
        return False
    current = vertex.subtasks[ex.subtask]
    if current is not ex and ex not in vertex.concurrent.get(ex.subtask, ()):
        return False
    rival = _rival(job, ex)
    if current is ex:
        if rival is None:
            return False  # the usual failure (a restart) follows
        rec.fact(AttemptWon(job.job_id, ex.vertex, ex.subtask, rival.attempt, []))
    rec.move(ex, TaskState.FAILED, error)
    return True
