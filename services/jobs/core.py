"""Jobs, pure: submission, failures and restarts, cancellation, lost TaskManagers, and time.

One door: ``decide(state, stimulus, now) -> Decision`` (services/common/decision.py). A
stimulus (services/jobs/stimuli.py) is a message from a job's inbox, a job to submit or to
schedule (services/jobs/scheduling.py), or something of the cluster (a TaskManager lost,
the log restarted, time passing); the decision holds the facts for the job's stream and
the messages to send (to a TaskManager, to the client). Facts are applied to the state as
they are decided (services/jobs/recorder.py); a stimulus that touches several jobs decides
one decision per job (``Decision.jobs``).

Its handlers: submission and a job inbox's messages here; failures shared by the handlers
in services/jobs/failures.py; lost TaskManagers, orphans, the log's restart and slot waits
in services/jobs/losses.py; scheduling in services/jobs/scheduling.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sluice.errors import MessageRejected, UnexpectedJobMessage
from sluice.events import (
    CancelJob,
    ExecutionGraphBuilt,
    JobStatus,
    JobStatusChanged,
    JobSubmitted,
    NotifyKvStateRegistered,
    NotifyKvStateUnregistered,
    OperatorEvent,
    RequestNextInputSplit,
    ScheduleOrUpdateConsumers,
    Success,
    TaskOperationResult,
    TaskState,
    TriggerCheckpoint,
    UpdateTaskExecutionState,
)
from sluice.services.common.decision import Address, Checkpoint, Decision, FailVertex, Rejected
from sluice.services.coordination.runtime import has_coordinator
from sluice.services.kvstate import core as kvstate

from .descriptor import descriptor, partition_path
from .failures import cancel_all, fail, fail_job, maybe_complete
from .losses import log_restarted, orphans, slot_waits, taskmanager_gone
from .machine import (
    HOLDS_SLOT,
    LIVE_JOB,
    LIVE_TASK,
    REPORTED,
    STARTED_TASK,
    STOPPING_JOB,
    TERMINAL_JOB,
)
from .recorder import Recorder
from .scheduling import MAX_DEPLOY_PER_PASS, schedule
from .speculation import Speculate, any_concurrent, concurrent_message, speculate
from .state import JobRun, JobsState, parse_execution_id
from .stimuli import (
    FailAtOnce,
    FreeSlots,
    Inbound,
    JobsConfig,
    LogRestart,
    Orphans,
    Schedule,
    SlotWaits,
    Stimulus,
    Submit,
    TaskManagerGone,
)

__all__ = [
    "decide",
    "Decision",
    "Stimulus",
    "Submit",
    "Inbound",
    "Schedule",
    "FailAtOnce",
    "TaskManagerGone",
    "Orphans",
    "LogRestart",
    "SlotWaits",
    "JobsConfig",
    "FreeSlots",
    "MAX_DEPLOY_PER_PASS",
    "partition_path",
    "descriptor",
    "UnexpectedJobMessage",
]


def decide(state: JobsState, stimulus: Stimulus | Speculate, now: int) -> Decision:
    """The jobs core's one door: what ``stimulus`` causes at ``now`` (its facts already applied
    to ``state``). It never raises for a message: one a job inbox does not take is
    ``Rejected`` with an UnexpectedJobMessage (the shell parks it), before anything is decided."""
    handler = _HANDLERS.get(type(stimulus))
    if handler is None:
        raise TypeError(f"{type(stimulus).__name__} is not a stimulus of the jobs core")  # a bug of the caller
    try:
        return handler(state, stimulus, now)
    except MessageRejected as exc:
        return Decision(instructions=[Rejected(exc)], job_id=getattr(stimulus, "job_id", ""), now=now)


# --- submission -------------------------------------------------------------------------------


def _submit(state: JobsState, s: Submit, now: int) -> Decision:
    """Accept a validated job (see ``Submit``)."""
    msg, splits, storage_root, first_attempt = s.msg, s.splits, s.storage_root, s.first_attempt
    rec = Recorder(state, msg.job_id, now)
    rec.fact(
        JobSubmitted(msg.job_id, msg.graph, msg.code_blob, msg.module, msg.reply_to, msg.params, splits, storage_root)
    )
    subtasks = sum(v.parallelism for v in msg.graph.vertices)
    results = sum(1 for v in msg.graph.vertices if any(e.source == v.name for e in msg.graph.edges))
    rec.fact(ExecutionGraphBuilt(msg.job_id, subtasks, results, first_attempt))
    return rec.decision


# --- messages from TaskManagers and clients -------------------------------------------------------


def _inbound(state: JobsState, s: Inbound, now: int) -> Decision:
    job_id, env, config = s.job_id, s.env, s.config
    job = state.jobs.get(job_id)
    rec = Recorder(state, job_id, now)
    msg = env.event
    if job is None:
        rec.note(f"job {job_id} not found")
        return rec.decision
    if (
        isinstance(msg, (UpdateTaskExecutionState, ScheduleOrUpdateConsumers, TaskOperationResult))
        and job.speculating
        and concurrent_message(rec, job, msg)
    ):
        maybe_complete(rec, job)  # (a loser cancelled may be the last task a stopping job waited for)
        _maybe_finished(rec, job)  # (or the last one a finished job waited for)
        return rec.decision
    if isinstance(msg, UpdateTaskExecutionState):
        _update(rec, job, msg, config)
    elif isinstance(msg, TaskOperationResult):
        if not msg.success:
            ex = job.current(msg.execution_id)
            if ex is not None and ex.state in (TaskState.DEPLOYING, TaskState.INITIALIZING):
                # One that is not retryable (its TaskManager cannot see the job's storage root or
                # inputs, so every attempt there would fail alike) fails the job at once.
                fail(
                    rec, job, ex, f"deployment failed on {ex.taskmanager}: {msg.message}", config, restart=msg.retryable
                )
    elif isinstance(msg, ScheduleOrUpdateConsumers):
        ex = job.current(msg.execution_id)
        if ex is not None and (msg.vertex_id, msg.subtask, msg.attempt) != (ex.vertex, ex.subtask, ex.attempt):
            ex = None  # its fields disagree with the attempt it names: malformed
        if ex is not None and not ex.produced and job.status not in TERMINAL_JOB and ex.state in LIVE_TASK:
            # Recorded as the leader knows the attempt, whatever else the message claims.
            rec.fact(ScheduleOrUpdateConsumers(job.job_id, ex.id, ex.vertex, ex.subtask, ex.attempt))
        else:
            rec.note(f"ScheduleOrUpdateConsumers from {msg.execution_id}, which is not running; ignored")
    elif isinstance(msg, (RequestNextInputSplit, OperatorEvent)):
        _coordinator_input(rec, job, msg)
    elif isinstance(msg, TriggerCheckpoint):
        if job.status in TERMINAL_JOB:
            rec.note(f"job {job_id} is {job.status.value}: its coordinators are gone")
        else:
            rec.instruct(Checkpoint())
    elif isinstance(msg, CancelJob):
        if job.status not in LIVE_JOB:
            rec.note(f"job {job_id} is already {job.status.value}")
        else:
            rec.fact(JobStatusChanged(job_id, JobStatus.CANCELLING, msg.reason))
            cancel_all(rec, job, msg.reason)
            maybe_complete(rec, job)
    elif isinstance(msg, (NotifyKvStateRegistered, NotifyKvStateUnregistered)):
        _kvstate(rec, job, msg, config)
    else:
        raise UnexpectedJobMessage(
            f"{msg.TYPE} is not a message a job inbox takes (it takes UpdateTaskExecutionState, "
            "TaskOperationResult, ScheduleOrUpdateConsumers, RequestNextInputSplit, OperatorEvent, "
            "TriggerCheckpoint, CancelJob, NotifyKvStateRegistered, NotifyKvStateUnregistered)"
        )
    return rec.decision


def _coordinator_input(rec: Recorder, job: JobRun, msg: RequestNextInputSplit | OperatorEvent) -> None:
    """A split request or an operator event from a subtask: recorded as a fact (the
    coordinator reacts to the fact) if it comes from the current attempt of a subtask of
    a vertex with a coordinator, while the job runs; otherwise ignored with the reason."""
    if isinstance(msg, OperatorEvent):
        if not msg.to_coordinator:
            rec.note("an OperatorEvent to a subtask was sent to the job's inbox; ignored")
            return
        vertex_name, subtask, attempt = msg.operator_id, msg.subtask, msg.attempt
    else:
        try:
            vertex_name, subtask, attempt = parse_execution_id(msg.execution_id)
        except ValueError:
            rec.note(f"split request with a malformed execution id {msg.execution_id!r}; ignored")
            return
    vertex = job.vertices.get(vertex_name)
    if vertex is None or not has_coordinator(vertex.spec):
        rec.note(f"{msg.TYPE} for {vertex_name!r}, which has no coordinator in job {job.job_id}; ignored")
        return
    if isinstance(msg, RequestNextInputSplit) and vertex.spec.kind != "source":
        rec.note(f"split request for {vertex_name!r}, which is not a source; ignored")
        return
    if not 0 <= subtask < len(vertex.subtasks):
        rec.note(f"{msg.TYPE} from subtask {subtask} of {vertex_name!r}, which has {len(vertex.subtasks)}")
        return
    ex = vertex.subtasks[subtask]
    if job.status not in LIVE_JOB:
        rec.note(f"{msg.TYPE} from {ex.id} while the job is {job.status.value}; ignored")
    elif ex.attempt != attempt or ex.state.terminal:
        rec.note(
            f"{msg.TYPE} from attempt {attempt} of {vertex_name}[{subtask}], which is not running "
            f"(current attempt {ex.attempt}, {ex.state.value}); ignored"
        )
    elif msg.seq and msg.seq <= ex.seq:
        rec.note(f"{msg.TYPE} #{msg.seq} from {ex.id} came again (it was sent twice); ignored")
    elif isinstance(msg, OperatorEvent):
        rec.fact(OperatorEvent(job.job_id, vertex_name, subtask, True, msg.body, attempt, msg.seq, rec.now))
    else:
        rec.fact(RequestNextInputSplit(job.job_id, vertex_name, subtask, ex.id, msg.host, msg.seq, rec.now))


def _fail_at_once(state: JobsState, s: FailAtOnce, now: int) -> Decision:
    """Fail a job at once, without restarts (a coordinator failed): cancel its tasks."""
    job_id, reason = s.job_id, s.reason
    rec = Recorder(state, job_id, now)
    job = state.jobs.get(job_id)
    if job is None or job.status not in LIVE_JOB:
        return rec.decision
    fail_job(rec, job, reason)
    return rec.decision


def _kvstate(
    rec: Recorder, job: JobRun, msg: NotifyKvStateRegistered | NotifyKvStateUnregistered, config: JobsConfig
) -> None:
    """The KvState registry decides (services/kvstate/core.py); a clash fails the vertex, no restart."""
    verdict = kvstate.decide(job, msg, rec.now)
    for note in verdict.notes:
        rec.note(note)
    for fact in verdict.facts:
        rec.fact(fact)
    for clash in verdict.of(FailVertex):
        if job.status in TERMINAL_JOB:
            continue
        vertex = job.vertices[clash.vertex]
        ex = (job.current(clash.execution_id) if clash.execution_id is not None else None) or next(
            (e for e in vertex.subtasks if e.state in HOLDS_SLOT), None
        )
        if ex is not None and ex.state in HOLDS_SLOT and ex.state != TaskState.CANCELING:
            fail(rec, job, ex, clash.reason, config, restart=False)
        elif job.status not in STOPPING_JOB:
            # No attempt of the vertex runs (they finished, or have not started): the job fails.
            fail_job(rec, job, f"vertex {clash.vertex} failed (no restart): {clash.reason}")


def _update(rec: Recorder, job: JobRun, msg: UpdateTaskExecutionState, config: JobsConfig) -> None:
    ex = job.current(msg.execution_id)
    if ex is None:
        rec.note(f"stale update for {msg.execution_id} ignored")
        return
    if (ex.state, msg.state) not in REPORTED:
        rec.note(f"{msg.execution_id}: {ex.state.value} -> {msg.state.value} is not a legal move; ignored")
        return
    if msg.state == TaskState.FAILED and ex.state != TaskState.CANCELING:
        # Not retryable: the TaskManager found the failure deterministic (its error says why).
        fail(rec, job, ex, msg.error or "failed without an error message", config, restart=msg.retryable)
        return
    if msg.state == TaskState.FINISHED and job.vertices[ex.vertex].outputs and not ex.produced:
        # A producer reports its partition complete before it finishes, but the report can
        # come later: a deposed leader may have read it first, and this leader reclaims it
        # only once it has been idle for a lease. Finished means produced: its consumers
        # must not wait for a report that is now ignored.
        rec.fact(ScheduleOrUpdateConsumers(job.job_id, ex.id, ex.vertex, ex.subtask, ex.attempt))
    rec.move(ex, msg.state, msg.error)
    if msg.state in STARTED_TASK and job.status == JobStatus.CREATED and job.sources_running():
        rec.fact(JobStatusChanged(job.job_id, JobStatus.RUNNING, None))
        rec.send(Address.client(job.reply_to), Success(job.job_id))
    _maybe_finished(rec, job)
    maybe_complete(rec, job)


def _maybe_finished(rec: Recorder, job: JobRun) -> None:
    """Every subtask finished: the job finished, once the attempts that lost a race ended
    too (they hold slots until their TaskManagers stop them: services/jobs/speculation.py)."""
    if job.status in LIVE_JOB and job.all_finished() and not (job.speculating and any_concurrent(job)):
        rec.fact(JobStatusChanged(job.job_id, JobStatus.FINISHED, None))


_HANDLERS: dict[type, Callable[[JobsState, Any, int], Decision]] = {
    Submit: _submit,
    Inbound: _inbound,
    Schedule: schedule,
    FailAtOnce: _fail_at_once,
    TaskManagerGone: taskmanager_gone,
    Orphans: orphans,
    LogRestart: log_restarted,
    SlotWaits: slot_waits,
    Speculate: speculate,
}
