"""Jobs, pure: submission, scheduling onto slots, lazy deployment, failures and restarts.

Each function takes the JobsState and a message (or the time) and returns what to commit:
facts for the job's stream and messages to send (to a TaskManager, to the client).
Facts are applied to the state as they are decided (a deployment takes a slot before the
next one is chosen); if the commit then fails, the shell throws the state away and
rebuilds it from the log, so the state never runs ahead of what was committed.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass, field

from sluice.errors import UnexpectedJobMessage
from sluice.events import (
    AttemptsRenumbered,
    CancelJob,
    CancelTask,
    Envelope,
    Event,
    ExecutionGraphBuilt,
    JobSlotsFound,
    JobStatus,
    JobStatusChanged,
    JobSubmitted,
    JobWaitingForSlots,
    NotifyKvStateRegistered,
    NotifyKvStateUnregistered,
    OperatorEvent,
    ProducerPartitions,
    RequestNextInputSplit,
    ScheduleOrUpdateConsumers,
    SubmitJob,
    SubmitTask,
    Success,
    TaskDeploymentDescriptor,
    TaskInput,
    TaskOperationResult,
    TaskOutput,
    TaskQueryable,
    TaskRestartScheduled,
    TaskSink,
    TaskSource,
    TaskState,
    TriggerCheckpoint,
    UpdateTaskExecutionState,
)
from sluice.services.coordination.runtime import has_coordinator
from sluice.services.kvstate import core as kvstate

from .machine import (
    HOLDS_SLOT,
    LIVE_JOB,
    LIVE_TASK,
    REPORTED,
    STARTED_TASK,
    STOPPING_JOB,
    TERMINAL_JOB,
    UNDEPLOYED_TASK,
)
from .state import Execution, JobRun, JobsState, evolve, parse_execution_id
from .timers import Timers

__all__ = ["JobsConfig", "Decision", "Dest", "submit", "MAX_DEPLOY_PER_PASS", "on_message", "schedule",
           "taskmanager_lost", "gone", "orphans", "log_restarted", "tick", "fail_job", "partition_path", "FreeSlots", "UnexpectedJobMessage"]

Dest = tuple[str, str]
"""Where a message goes: ("tm", resource_id) or ("inbox", stream key)."""

FreeSlots = dict[str, list[int]]
"""Free slots per registered TaskManager."""

@dataclass(frozen=True)
class JobsConfig:
    slot_timeout_ms: int = 300_000
    deploy_timeout_ms: int = 60_000
    """An attempt DEPLOYING this long, not held by its TaskManager, fails (services/jobs/reconcile.py)."""


@dataclass
class Decision:
    job_id: str
    now: int
    facts: list[Event] = field(default_factory=list)
    sends: list[tuple[Dest, Event]] = field(default_factory=list)
    note: str | None = None
    checkpoint: bool = False
    """Checkpoint the job's coordinators now (``TriggerCheckpoint``)."""

    def __bool__(self) -> bool:
        return bool(self.facts or self.sends)


class _Recorder:
    """Collects facts and applies each to the state at once (see the module doc)."""

    def __init__(self, state: JobsState, job_id: str, now: int) -> None:
        self.state, self.now = state, now
        self.decision = Decision(job_id, now)

    def fact(self, ev: Event) -> None:
        self.decision.facts.append(ev)
        evolve(self.state, Envelope(ev, "", self.state.epoch, self.now))
        job = self.state.jobs.get(self.decision.job_id)
        if job is not None and job.kvstate.locations:
            for follow in kvstate.released(job, ev):  # a failed attempt's queryable state goes with it
                self.fact(follow)

    def send(self, dest: Dest, ev: Event) -> None:
        self.decision.sends.append((dest, ev))


def partition_path(storage_root: str, job_id: str, vertex: str, subtask: int, attempt: int) -> str:
    """Where one attempt's result partition lives; the vertex name is made path-safe."""
    return f"{_vertex_dir(storage_root, job_id, vertex)}/{subtask}/{attempt}"


@functools.lru_cache(maxsize=4096)
def _vertex_dir(storage_root: str, job_id: str, vertex: str) -> str:
    """The folder of a vertex's partitions (a regex and a digest: remembered, as every
    deployment of the vertex's subtasks asks for it)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", vertex).strip("_") or "vertex"
    digest = hashlib.sha1(vertex.encode()).hexdigest()[:6]
    return f"{storage_root.rstrip('/')}/{job_id}/{safe}-{digest}"


# --- submission -------------------------------------------------------------------------------


def submit(state: JobsState, msg: SubmitJob, splits: dict[str, list], storage_root: str, now: int,
           first_attempt: int = 0) -> Decision:
    """Accept a validated job: record it and build its ExecutionGraph (every subtask's first
    attempt numbered ``first_attempt``: the cluster's attempt floor)."""
    rec = _Recorder(state, msg.job_id, now)
    rec.fact(JobSubmitted(msg.job_id, msg.graph, msg.code_blob, msg.module, msg.reply_to, msg.params, splits,
                          storage_root))
    subtasks = sum(v.parallelism for v in msg.graph.vertices)
    results = sum(1 for v in msg.graph.vertices if any(e.source == v.name for e in msg.graph.edges))
    rec.fact(ExecutionGraphBuilt(msg.job_id, subtasks, results, first_attempt))
    return rec.decision


# --- messages from TaskManagers and clients -------------------------------------------------------


def on_message(state: JobsState, job_id: str, env: Envelope, config: JobsConfig, now: int) -> Decision:
    job = state.jobs.get(job_id)
    rec = _Recorder(state, job_id, now)
    msg = env.event
    if job is None:
        rec.decision.note = f"job {job_id} not found"
        return rec.decision
    if isinstance(msg, UpdateTaskExecutionState):
        _update(rec, job, msg, config)
    elif isinstance(msg, TaskOperationResult):
        if not msg.success:
            ex = job.current(msg.execution_id)
            if ex is not None and ex.state in (TaskState.DEPLOYING, TaskState.INITIALIZING):
                # One that is not retryable (its TaskManager cannot see the job's storage root or
                # inputs, so every attempt there would fail alike) fails the job at once.
                _fail(rec, job, ex, f"deployment failed on {ex.taskmanager}: {msg.message}", config,
                      restart=msg.retryable)
    elif isinstance(msg, ScheduleOrUpdateConsumers):
        ex = job.current(msg.execution_id)
        if ex is not None and (msg.vertex_id, msg.subtask, msg.attempt) != (ex.vertex, ex.subtask, ex.attempt):
            ex = None  # its fields disagree with the attempt it names: malformed
        if ex is not None and not ex.produced and job.status not in TERMINAL_JOB \
                and ex.state in LIVE_TASK:
            # Recorded as the leader knows the attempt, whatever else the message claims.
            rec.fact(ScheduleOrUpdateConsumers(job.job_id, ex.id, ex.vertex, ex.subtask, ex.attempt))
        else:
            rec.decision.note = f"ScheduleOrUpdateConsumers from {msg.execution_id}, which is not running; ignored"
    elif isinstance(msg, (RequestNextInputSplit, OperatorEvent)):
        _coordinator_input(rec, job, msg)
    elif isinstance(msg, TriggerCheckpoint):
        if job.status in TERMINAL_JOB:
            rec.decision.note = f"job {job_id} is {job.status.value}: its coordinators are gone"
        else:
            rec.decision.checkpoint = True
    elif isinstance(msg, CancelJob):
        if job.status not in LIVE_JOB:
            rec.decision.note = f"job {job_id} is already {job.status.value}"
        else:
            rec.fact(JobStatusChanged(job_id, JobStatus.CANCELLING, msg.reason))
            _cancel_all(rec, job, msg.reason)
            _maybe_complete(rec, job)
    elif isinstance(msg, (NotifyKvStateRegistered, NotifyKvStateUnregistered)):
        _kvstate(rec, job, msg, config)
    else:
        raise UnexpectedJobMessage(
            f"{msg.TYPE} is not a message a job inbox takes (it takes UpdateTaskExecutionState, "
            "TaskOperationResult, ScheduleOrUpdateConsumers, RequestNextInputSplit, OperatorEvent, "
            "TriggerCheckpoint, CancelJob, NotifyKvStateRegistered, NotifyKvStateUnregistered)"
        )
    return rec.decision


def _coordinator_input(rec: _Recorder, job: JobRun, msg: RequestNextInputSplit | OperatorEvent) -> None:
    """A split request or an operator event from a subtask: recorded as a fact (the
    coordinator reacts to the fact) if it comes from the current attempt of a subtask of
    a vertex with a coordinator, while the job runs; otherwise ignored with the reason."""
    if isinstance(msg, OperatorEvent):
        if not msg.to_coordinator:
            rec.decision.note = "an OperatorEvent to a subtask was sent to the job's inbox; ignored"
            return
        vertex_name, subtask, attempt = msg.operator_id, msg.subtask, msg.attempt
    else:
        try:
            vertex_name, subtask, attempt = parse_execution_id(msg.execution_id)
        except ValueError:
            rec.decision.note = f"split request with a malformed execution id {msg.execution_id!r}; ignored"
            return
    vertex = job.vertices.get(vertex_name)
    if vertex is None or not has_coordinator(vertex.spec):
        rec.decision.note = f"{msg.TYPE} for {vertex_name!r}, which has no coordinator in job {job.job_id}; ignored"
        return
    if isinstance(msg, RequestNextInputSplit) and vertex.spec.kind != "source":
        rec.decision.note = f"split request for {vertex_name!r}, which is not a source; ignored"
        return
    if not 0 <= subtask < len(vertex.subtasks):
        rec.decision.note = f"{msg.TYPE} from subtask {subtask} of {vertex_name!r}, which has {len(vertex.subtasks)}"
        return
    ex = vertex.subtasks[subtask]
    if job.status not in LIVE_JOB:
        rec.decision.note = f"{msg.TYPE} from {ex.id} while the job is {job.status.value}; ignored"
    elif ex.attempt != attempt or ex.state.terminal:
        rec.decision.note = f"{msg.TYPE} from attempt {attempt} of {vertex_name}[{subtask}], which is not running " \
                            f"(current attempt {ex.attempt}, {ex.state.value}); ignored"
    elif msg.seq and msg.seq <= ex.seq:
        rec.decision.note = f"{msg.TYPE} #{msg.seq} from {ex.id} came again (it was sent twice); ignored"
    elif isinstance(msg, OperatorEvent):
        rec.fact(OperatorEvent(job.job_id, vertex_name, subtask, True, msg.body, attempt, msg.seq, rec.now))
    else:
        rec.fact(RequestNextInputSplit(job.job_id, vertex_name, subtask, ex.id, msg.host, msg.seq, rec.now))


def fail_job(state: JobsState, job_id: str, reason: str, now: int) -> Decision:
    """Fail a job at once, without restarts (a coordinator failed): cancel its tasks."""
    rec = _Recorder(state, job_id, now)
    job = state.jobs.get(job_id)
    if job is None or job.status not in LIVE_JOB:
        return rec.decision
    _fail_job(rec, job, reason)
    return rec.decision


def _kvstate(rec: _Recorder, job: JobRun, msg: NotifyKvStateRegistered | NotifyKvStateUnregistered,
             config: JobsConfig) -> None:
    """The KvState registry decides (services/kvstate/core.py); a clash fails the vertex, no restart."""
    verdict = kvstate.decide(job, rec.decision.job_id, msg)
    rec.decision.note = verdict.error
    for fact in verdict.facts:
        rec.fact(fact)
    if verdict.fail_vertex is not None and job.status not in TERMINAL_JOB:
        vertex = job.vertices[verdict.fail_vertex]
        ex = verdict.fail or next((e for e in vertex.subtasks if e.state in HOLDS_SLOT), None)
        reason = verdict.error or "KvState registration clash"
        if ex is not None and ex.state in HOLDS_SLOT and ex.state != TaskState.CANCELING:
            _fail(rec, job, ex, reason, config, restart=False)
        elif job.status not in STOPPING_JOB:
            # No attempt of the vertex runs (they finished, or have not started): the job fails.
            _fail_job(rec, job, f"vertex {verdict.fail_vertex} failed (no restart): {reason}")


def _update(rec: _Recorder, job: JobRun, msg: UpdateTaskExecutionState, config: JobsConfig) -> None:
    ex = job.current(msg.execution_id)
    if ex is None:
        rec.decision.note = f"stale update for {msg.execution_id} ignored"
        return
    if (ex.state, msg.state) not in REPORTED:
        rec.decision.note = f"{msg.execution_id}: {ex.state.value} -> {msg.state.value} is not a legal move; ignored"
        return
    if msg.state == TaskState.FAILED and ex.state != TaskState.CANCELING:
        _fail(rec, job, ex, msg.error or "failed without an error message", config)
        return
    if msg.state == TaskState.FINISHED and job.vertices[ex.vertex].outputs and not ex.produced:
        # A producer reports its partition complete before it finishes, but the report can
        # come later: a deposed leader may have read it first, and this leader reclaims it
        # only once it has been idle for a lease. Finished means produced: its consumers
        # must not wait for a report that is now ignored.
        rec.fact(ScheduleOrUpdateConsumers(job.job_id, ex.id, ex.vertex, ex.subtask, ex.attempt))
    rec.fact(UpdateTaskExecutionState(job.job_id, ex.id, msg.state, msg.error, ex.vertex, ex.subtask, ex.attempt,
                                      ex.taskmanager, ex.slot))
    if msg.state in STARTED_TASK and job.status == JobStatus.CREATED \
            and job.sources_running():
        rec.fact(JobStatusChanged(job.job_id, JobStatus.RUNNING, None))
        rec.send(("inbox", job.reply_to), Success(job.job_id))
    if job.status in LIVE_JOB and job.all_finished():
        rec.fact(JobStatusChanged(job.job_id, JobStatus.FINISHED, None))
    _maybe_complete(rec, job)


def _fail(rec: _Recorder, job: JobRun, ex: Execution, error: str, config: JobsConfig, restart: bool = True) -> None:
    """An execution failed: restart it if the job's strategy allows (and ``restart``), else fail the job."""
    rec.fact(UpdateTaskExecutionState(job.job_id, ex.id, TaskState.FAILED, error, ex.vertex, ex.subtask, ex.attempt,
                                      ex.taskmanager, ex.slot))
    if job.status not in LIVE_JOB:
        _maybe_complete(rec, job)
        return
    strategy = job.graph.restart
    if restart and strategy.kind != "none" and job.restarts < strategy.attempts:
        delay = strategy.delay_ms
        if strategy.kind == "exponential-backoff":
            delay = min(strategy.delay_ms * (2 ** job.restarts), strategy.max_delay_ms)
        rec.fact(TaskRestartScheduled(job.job_id, ex.vertex, ex.subtask, ex.attempt + 1, rec.now + delay,
                                      job.restarts + 1))
        return
    tried = f"after {job.restarts} restart{'s' if job.restarts != 1 else ''}" if strategy.kind != "none" else "(restart strategy: none)"
    if not restart:
        tried = "(no restart)"
    _fail_job(rec, job, f"task {ex.vertex}[{ex.subtask}] failed {tried}: {error}")


def _fail_job(rec: _Recorder, job: JobRun, reason: str, cancel_reason: str = "the job is failing") -> None:
    """The job fails with ``reason`` as its root cause: its tasks are cancelled."""
    rec.fact(JobStatusChanged(job.job_id, JobStatus.FAILING, reason))
    _cancel_all(rec, job, cancel_reason)
    _maybe_complete(rec, job)


def _cancel_all(rec: _Recorder, job: JobRun, reason: str) -> None:
    for ex in job.executions():
        if ex.state in UNDEPLOYED_TASK:
            rec.fact(UpdateTaskExecutionState(job.job_id, ex.id, TaskState.CANCELED, None, ex.vertex, ex.subtask,
                                              ex.attempt, ex.taskmanager, ex.slot))
        elif ex.state in LIVE_TASK:
            rec.fact(UpdateTaskExecutionState(job.job_id, ex.id, TaskState.CANCELING, None, ex.vertex, ex.subtask,
                                              ex.attempt, ex.taskmanager, ex.slot))
            rec.send(("tm", ex.taskmanager or ""), CancelTask(job.job_id, ex.id, reason))


def _maybe_complete(rec: _Recorder, job: JobRun) -> None:
    if job.status == JobStatus.FAILING and job.all_terminal():
        rec.fact(JobStatusChanged(job.job_id, JobStatus.FAILED, None))
    elif job.status == JobStatus.CANCELLING and job.all_terminal():
        rec.fact(JobStatusChanged(job.job_id, JobStatus.CANCELED, None))


# --- scheduling ---------------------------------------------------------------------------------


def schedule(state: JobsState, job_id: str, free: FreeSlots, now: int,
             sessions: dict[str, str] | None = None, *, timers: Timers | None = None, clock: int = 0) -> Decision:
    """Deploy every ready execution whose inputs are available, each on a free slot of the
    TaskManager with the most free slots (so a vertex spreads over TaskManagers). ``free``
    is taken from as slots are assigned; ``sessions`` names each TaskManager's current
    registration, recorded with the placement. A restarted attempt waits out its delay on
    the leader's monotonic ``clock`` (``timers``: services/jobs/timers.py); without
    ``timers`` (the core on its own, one clock for everything) on ``now``."""
    job = state.jobs[job_id]
    rec = _Recorder(state, job_id, now)
    if job.status not in LIVE_JOB or not job.built:
        return rec.decision
    ready = job.ready
    waiting = 0
    later: list[Execution] = []
    deployed = 0
    capped = False
    for _ in range(len(ready)):
        ex = ready.popleft()
        if deployed >= MAX_DEPLOY_PER_PASS:
            later.append(ex)  # the rest next pass: the main loop stays responsive
            capped = True
            continue
        if ex.state != TaskState.CREATED or not job.inputs_available(ex):
            continue
        if (timers.held_back(job_id, ex, clock) if timers is not None else now < ex.not_before):
            later.append(ex)
            continue
        tm = _pick(free)
        if tm is None:
            # No TaskManager has a free slot: no other task can be placed this pass. Stop
            # here (the rest keep their place in the queue): looking at every queued task on
            # every pass made a job of N tasks on a few slots cost O(N^2) (a 3,000-task job
            # kept the leader busy all the time).
            later.append(ex)
            waiting = 1 + len(ready)  # at most: the rest are not checked for inputs
            break
        _deploy(rec, job, ex, tm, free[tm].pop(0), (sessions or {}).get(tm))
        deployed += 1
    ready.extendleft(reversed(later))  # ahead of what this pass did not look at, in order
    if waiting and job.waiting_since is None:
        rec.fact(JobWaitingForSlots(job_id, waiting, 0))
    elif not waiting and not capped and job.waiting_since is not None:
        # Every task this pass looked at has a slot (one that stopped at the cap did not look
        # at them all). A v1 wait that a slot taken did not end ends here too.
        rec.fact(JobSlotsFound(job_id))
    return rec.decision


MAX_DEPLOY_PER_PASS = 1000


def _pick(free: FreeSlots) -> str | None:
    """The TaskManager with the most free slots (ties: the first by name)."""
    best = min(((-len(slots), tm) for tm, slots in free.items() if slots), default=None)
    return best[1] if best else None


def _deploy(rec: _Recorder, job: JobRun, ex: Execution, tm: str, slot: int, session: str | None = None) -> None:
    eid = ex.id
    rec.fact(UpdateTaskExecutionState(job.job_id, eid, TaskState.SCHEDULED, None, ex.vertex, ex.subtask, ex.attempt,
                                      tm, slot, session))
    rec.fact(UpdateTaskExecutionState(job.job_id, eid, TaskState.DEPLOYING, None, ex.vertex, ex.subtask, ex.attempt,
                                      tm, slot))
    rec.send(("tm", tm), SubmitTask(job.job_id, eid, ex.vertex, ex.subtask, ex.attempt, slot, descriptor(job, ex)))


def descriptor(job: JobRun, ex: Execution) -> TaskDeploymentDescriptor:
    """The task deployment descriptor: everything a TaskManager needs to run this attempt."""
    vertex = job.vertices[ex.vertex]
    spec = vertex.spec
    maxp = job.graph.max_parallelism
    inputs = []
    for edge in vertex.inputs:
        producer = job.vertices[edge.source]
        if edge.exchange == "forward":
            p = producer.subtasks[ex.subtask]
            inputs.append(TaskInput(paths=[partition_path(job.storage_root, job.job_id, edge.source, p.subtask,
                                                          p.attempt)]))
        else:
            from sluice.services.dataplane.keygroups import key_group_range  # (lazy: the package imports Spark's side)

            # All-to-all: name the producers' partitions compactly (a path template and only
            # the attempts that are not the job's first), so descriptors stay O(1) per
            # consumer, not O(P).
            template = partition_path(job.storage_root, job.job_id, edge.source, 0, 0)[:-4] + "/{subtask}/{attempt}"
            attempts = producer.moved_attempts(job.floor)
            inputs.append(TaskInput(producer=ProducerPartitions(template, len(producer.subtasks), attempts, job.floor),
                                    key_groups=list(key_group_range(maxp, len(vertex.subtasks), ex.subtask)),
                                    consumer=ex.subtask))
    output = None
    if vertex.outputs:
        keyed, found, consumers = None, False, 0
        for e in vertex.outputs:  # (loops, not generators: this runs once a deployment)
            if not found and e.exchange == "keyed":
                keyed, found = e.key, True
            consumers = max(consumers, len(job.vertices[e.target].subtasks))
        output = TaskOutput(partition_path(job.storage_root, job.job_id, ex.vertex, ex.subtask, ex.attempt), keyed,
                            consumers)
    source = sink = queryable = None
    if spec.source is not None:
        # No splits here: the reader asks the source coordinator for them one at a time.
        # A reader that gets no split still needs the source's schema: it reads the first
        # split's schema (no rows) from this one.
        plan = job.splits.get(ex.vertex) or [None]
        source = TaskSource(spec.source.format, dict(spec.source.options), spec.source.protocol, plan[0],
                            spec.source.each_split)
    if spec.sink is not None:
        sink = TaskSink(spec.sink.format, spec.sink.path, dict(spec.sink.options))
    if spec.queryable is not None:  # queryable state, keyed by the vertex's input key (services/kvstate)
        queryable = TaskQueryable(spec.queryable, next((e.key for e in vertex.inputs if e.exchange == "keyed"), None))
    return TaskDeploymentDescriptor(
        job.job_id, ex.id, ex.vertex, ex.subtask, ex.attempt, len(vertex.subtasks), maxp, spec.kind, job.code_blob,
        job.module, list(spec.functions), dict(job.params), inputs, output, source, sink, queryable, job.storage_root)


# --- cluster events and time ---------------------------------------------------------------------


def gone(rec: _Recorder, job: JobRun, ex: Execution, reason: str, config: JobsConfig) -> None:
    """An attempt its TaskManager no longer runs (lost, or it does not hold it): one being
    cancelled is CANCELED, any other FAILED with ``reason`` (and restarted if it may be)."""
    if ex.state == TaskState.CANCELING:
        rec.fact(UpdateTaskExecutionState(job.job_id, ex.id, TaskState.CANCELED, None, ex.vertex, ex.subtask,
                                          ex.attempt, ex.taskmanager, ex.slot))
    else:
        _fail(rec, job, ex, reason, config)


def taskmanager_lost(state: JobsState, resource_id: str, reason: str, config: JobsConfig, now: int,
                     session: str | None = None) -> list[Decision]:
    """Every execution on a lost TaskManager (``session``: only on that registration of it)
    fails, and may be restarted elsewhere."""
    out = []
    for job in list(state.jobs.values()):
        if job.status in TERMINAL_JOB:
            continue
        rec = _Recorder(state, job.job_id, now)
        for ex in list(job.executions()):
            if ex.taskmanager == resource_id and ex.state in HOLDS_SLOT \
                    and (session is None or ex.session is None or ex.session == session):
                gone(rec, job, ex, f"TaskManager {resource_id} was lost ({reason})", config)
        _maybe_complete(rec, job)
        if rec.decision:
            out.append(rec.decision)
    return out


def orphans(state: JobsState, active: dict[str, str], reasons: dict[str, str], config: JobsConfig,
            now: int, registered: dict[str, int] | None = None) -> list[Decision]:
    """Executions placed on a TaskManager registration that is gone fail: the leader that
    saw it go died before it failed them. Gone: the TaskManager is not registered, or
    registered again as a new session, or registered again (even under the same session)
    at a later epoch than the attempt was placed at, so a loss ended the registration the
    attempt was placed on. ``active``: resource id -> current session; ``registered``:
    resource id -> the epoch its current registration began at."""
    out = []
    since = registered or {}
    for job in list(state.jobs.values()):
        if job.status in TERMINAL_JOB:
            continue
        rec = _Recorder(state, job.job_id, now)
        for ex in list(job.executions()):
            if ex.state not in HOLDS_SLOT or ex.taskmanager is None:
                continue
            current = active.get(ex.taskmanager)
            renewed = ex.placed_epoch is not None and ex.placed_epoch < since.get(ex.taskmanager, 0)
            if current is not None and (ex.session is None or ex.session == current) and not renewed:
                continue
            if current is not None and renewed:
                why = (f"it registered again at epoch {since[ex.taskmanager]}, after a loss; the attempt was placed "
                       f"at epoch {ex.placed_epoch}, on the registration that loss ended")
            else:
                why = reasons.get(ex.taskmanager) or "not registered"
            gone(rec, job, ex, f"TaskManager {ex.taskmanager} was lost ({why})", config)
        _maybe_complete(rec, job)
        if rec.decision:
            out.append(rec.decision)
    return out


def log_restarted(state: JobsState, reason: str, now: int, attempt_floor: int) -> list[Decision]:
    """The log's server restarted and may have lost its last writes: no attempt that was
    not finished is trusted. Each runs again (not counted against the restart strategy:
    the cluster, not the job, failed) as an attempt numbered at least ``attempt_floor`` (the
    server's clock), which no attempt started before the restart can have had: writes
    that were lost may have deployed attempts the log no longer knows of."""
    out = []
    for job in list(state.jobs.values()):
        if job.status in TERMINAL_JOB or not job.built or job.floor >= attempt_floor:
            continue  # ended, or renumbered at this floor already (recovery resumed by a new leader)
        rec = _Recorder(state, job.job_id, now)
        rec.fact(AttemptsRenumbered(job.job_id, attempt_floor, reason))
        ending = job.status in STOPPING_JOB
        for ex in list(job.executions()):
            if ex.state == TaskState.CANCELING or (ending and ex.state in HOLDS_SLOT):
                rec.fact(UpdateTaskExecutionState(job.job_id, ex.id, TaskState.CANCELED, reason, ex.vertex,
                                                  ex.subtask, ex.attempt, ex.taskmanager, ex.slot))
            elif ending:
                continue
            elif ex.state in HOLDS_SLOT:
                rec.fact(UpdateTaskExecutionState(job.job_id, ex.id, TaskState.FAILED, reason, ex.vertex,
                                                  ex.subtask, ex.attempt, ex.taskmanager, ex.slot))
                rec.fact(TaskRestartScheduled(job.job_id, ex.vertex, ex.subtask, max(ex.attempt + 1, attempt_floor),
                                              now, job.restarts))
            elif ex.state == TaskState.CREATED:
                rec.fact(TaskRestartScheduled(job.job_id, ex.vertex, ex.subtask, max(ex.attempt + 1, attempt_floor),
                                              max(now, ex.not_before), job.restarts))
        _maybe_complete(rec, job)
        if rec.decision:
            out.append(rec.decision)
    return out


def tick(state: JobsState, config: JobsConfig, now: int, total_slots: int, since: int = 0, *,
         timers: Timers | None = None, clock: int = 0) -> list[Decision]:
    """Jobs that waited too long for slots fail: counted from the wait's start or the job's
    last slot taken, whichever is later (a job that takes slots makes progress), and from
    ``since`` at the earliest (when a leader that rebuilt jobs while serving could schedule
    again). The leader measures the wait on its monotonic ``clock`` from when it first saw
    it so (``timers``: services/jobs/timers.py; it looks only once it can schedule, so
    ``since`` is then implied); without ``timers`` (the core on its own, one clock for
    everything) the log's stamps are compared with ``now``."""
    out = []
    if timers is not None:
        timers.keep(state)
    for job in list(state.jobs.values()):
        if job.waiting_since is None or job.status not in LIVE_JOB:
            continue
        if timers is not None:
            waited = timers.slot_wait(job, clock)
        else:
            waited = now - max(job.waiting_since, job.slot_taken_at or 0, since)
        if waited > config.slot_timeout_ms:
            rec = _Recorder(state, job.job_id, now)
            pending = sum(1 for ex in job.executions() if ex.state == TaskState.CREATED)
            _fail_job(rec, job, f"waited {waited // 1000} s for free slots ({pending} tasks not deployed; the "
                                f"cluster has {total_slots} slots): add TaskManagers (sluice scale) or lower the "
                                "parallelism", "no slots")
            out.append(rec.decision)
    return out
