"""The JobManager's view of jobs: every job's ExecutionGraph and the slots its tasks hold,
folded from the jobs' fact streams by ``evolve`` (no I/O, no clock)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sluice.errors import IllegalTransition
from sluice.events import (
    AttemptsRenumbered,
    AttemptWon,
    CoordinatorCheckpointed,
    Envelope,
    Event,
    ExecutionGraphBuilt,
    JobDisposed,
    JobEdge,
    JobGraph,
    JobSlotsFound,
    JobStatus,
    JobStatusChanged,
    JobSubmitted,
    JobVertex,
    JobWaitingForSlots,
    KvStateNotificationRefused,
    NextInputSplit,
    NotifyKvStateRegistered,
    NotifyKvStateUnregistered,
    OperatorEvent,
    RequestNextInputSplit,
    ScheduleOrUpdateConsumers,
    SpeculativeAttemptScheduled,
    TaskRestartScheduled,
    TaskState,
    UpdateTaskExecutionState,
)
from sluice.services.kvstate import registry as kvreg

from .machine import HOLDS_SLOT, STARTED_TASK, TASK_MOVES, TERMINAL_JOB, check_job, check_task
from .slot_pool import SlotPool

__all__ = [
    "Execution",
    "VertexRun",
    "JobRun",
    "JobsState",
    "SlotPool",
    "evolve",
    "execution_id",
    "parse_execution_id",
    "HOLDS_SLOT",
    "TERMINAL_JOB",
]
# (HOLDS_SLOT and TERMINAL_JOB are services/jobs/machine.py's groups, named here too: much imports them from here;
# SlotPool is services/jobs/slot_pool.py's.)


def execution_id(vertex: str, subtask: int, attempt: int) -> str:
    return f"{vertex}:{subtask}:{attempt}"


def parse_execution_id(eid: str) -> tuple[str, int, int]:
    vertex, subtask, attempt = eid.rsplit(":", 2)
    return vertex, int(subtask), int(attempt)


@dataclass(slots=True)
class Execution:
    """The current attempt of one subtask."""

    vertex: str
    subtask: int
    attempt: int = 0
    state: TaskState = TaskState.CREATED
    taskmanager: str | None = None
    slot: int | None = None
    error: str | None = None
    since: int = 0
    not_before: int = 0
    produced: bool = False
    seq: int = 0
    """The highest numbered message this attempt sent its coordinator that was taken."""
    session: str | None = None
    """The registration of the TaskManager this attempt was placed on."""
    history: list[tuple[int, str]] = field(default_factory=list)
    """The subtask's recent moves, (time, what): the story an illegal move is told with."""
    placed_epoch: int | None = None
    """The leader epoch of the fact that placed this attempt in its slot (None: not placed,
    or restored from a snapshot that did not say): an attempt placed before its TaskManager's
    current registration began ran on a registration that a loss ended (``core.orphans``)."""

    @property
    def id(self) -> str:
        return execution_id(self.vertex, self.subtask, self.attempt)


@dataclass(slots=True)
class VertexRun:
    spec: JobVertex
    inputs: list[JobEdge]
    outputs: list[JobEdge]
    subtasks: list[Execution]
    produced: int = 0
    finished: int = 0
    started: int = 0
    """Subtasks whose current attempt is RUNNING or FINISHED."""
    restarted: int = field(default=0, compare=False, repr=False)
    """How many restarts this vertex's subtasks had since this state was built or restored:
    it only tells a cache (``moved_attempts``) that the subtasks' attempts changed."""
    moved: tuple[tuple[int, int], dict[str, int]] | None = field(default=None, compare=False, repr=False)
    concurrent: dict[int, list[Execution]] = field(default_factory=dict)
    """Speculative execution (services/jobs/speculation.py): subtask -> its attempts that run
    besides its current one (a speculative attempt, or a loser being cancelled). Empty unless
    speculation is on."""
    highest: dict[int, int] = field(default_factory=dict)
    """Subtask -> the highest attempt speculation gave it: a restart is numbered above it."""

    def moved_attempts(self, floor: int) -> dict[str, int]:
        """Each subtask whose attempt is not ``floor`` (the job's first), with its attempt:
        how a consumer's descriptor names an all-to-all input compactly. Kept until a
        subtask restarts, so deploying N consumers costs O(N), not O(N^2) (as Flink caches
        an intermediate result's shuffle descriptors). Shared: never changed in place."""
        key = (self.restarted, floor)
        if self.moved is None or self.moved[0] != key:
            self.moved = (key, {str(p.subtask): p.attempt for p in self.subtasks if p.attempt != floor})
        return self.moved[1]


@dataclass
class JobRun:
    job_id: str
    graph: JobGraph
    code_blob: str
    module: str
    reply_to: str
    params: dict[str, str]
    splits: dict[str, list[Any]]
    storage_root: str
    submitted_at: int
    status: JobStatus = JobStatus.CREATED
    reason: str | None = None
    vertices: dict[str, VertexRun] = field(default_factory=dict)
    restarts: int = 0
    waiting_since: int | None = None
    """When the job began to wait for slots (None: it does not wait)."""
    wait_until_placed: bool = False
    """The wait lasts until ``JobSlotsFound`` (a v2 ``JobWaitingForSlots``); else until the
    job's next slot taken (a v1 fact, from an older leader)."""
    slot_taken_at: int | None = None
    """When one of the job's attempts last took a slot: a wait times out counted from it."""
    built: bool = False
    ended_at: int | None = None
    # Executions that may be deployable (checked again when scheduling): CREATED ones whose
    # inputs became available. An index for the scheduler, derived from the facts.
    ready: deque[Execution] = field(default_factory=deque)
    # Queryable state: registration name -> KvStateLocation (services/kvstate).
    kvstate: kvreg.KvStateRegistry = field(default_factory=kvreg.KvStateRegistry)
    history: list[tuple[int, str]] = field(default_factory=list)
    floor: int = 0
    """The number of the job's first attempts (ExecutionGraphBuilt), raised when the job's
    attempts are renumbered (AttemptsRenumbered)."""
    by_id: dict[str, tuple[Execution, int]] = field(default_factory=dict, compare=False, repr=False)
    """A cache for ``current``: execution id -> (its execution, the attempt it was then), good
    while the attempt is the same (a restart drops it). Slot reports, timeouts and messages
    ask ``current`` for every attempt again and again; parsing each id cost the leader
    a few percent of its time at 2 x 10,000 subtasks."""

    @property
    def name(self) -> str:
        return self.graph.name

    def executions(self) -> Iterator[Execution]:
        """Every subtask's current attempt, and the attempts that run besides it (speculation)."""
        for v in self.vertices.values():
            yield from v.subtasks
            for others in v.concurrent.values():
                yield from others

    @property
    def speculating(self) -> bool:
        """Some subtask of the job had a speculative attempt (services/jobs/speculation.py)."""
        return any(v.highest for v in self.vertices.values())

    def attempt_of(self, eid: str) -> Execution | None:
        """The execution ``eid`` names: its subtask's current attempt, or one running besides it."""
        ex = self.current(eid)
        if ex is not None:
            return ex
        try:
            vertex, subtask, attempt = parse_execution_id(eid)
            others = self.vertices[vertex].concurrent.get(subtask, ())
        except (ValueError, KeyError):
            return None
        return next((o for o in others if o.attempt == attempt), None)

    def current(self, eid: str) -> Execution | None:
        """The execution ``eid`` names, if it is its subtask's current attempt."""
        hit = self.by_id.get(eid)
        if hit is not None and hit[0].attempt == hit[1]:
            return hit[0]
        try:
            vertex, subtask, attempt = parse_execution_id(eid)
            if subtask < 0:
                return None  # not an index from the end: "v:-1:0" names no subtask
            ex = self.vertices[vertex].subtasks[subtask]
        except (ValueError, KeyError, IndexError):
            return None
        if ex.attempt != attempt or ex.id != eid:
            return None
        self.by_id[eid] = (ex, attempt)
        return ex

    def inputs_available(self, ex: Execution) -> bool:
        for edge in self.vertices[ex.vertex].inputs:
            producer = self.vertices[edge.source]
            if edge.exchange == "forward":
                if not producer.subtasks[ex.subtask].produced:
                    return False
            elif producer.produced < len(producer.subtasks):
                return False
        return True

    def sources_running(self) -> bool:
        return all(v.started == len(v.subtasks) for v in self.vertices.values() if v.spec.kind == "source")

    def all_finished(self) -> bool:
        return all(v.finished == len(v.subtasks) for v in self.vertices.values())

    def all_terminal(self) -> bool:
        return all(ex.state.terminal or ex.state == TaskState.CREATED for ex in self.executions())


@dataclass
class JobsState:
    jobs: dict[str, JobRun] = field(default_factory=dict)
    pool: SlotPool = field(default_factory=SlotPool)
    epoch: int = 0
    """The epoch the facts decided on this state will be committed at (the leader's: set
    when it takes over), so what the core folds as it decides carries the epoch a replay of
    the committed facts sees (``Execution.placed_epoch``). Not folded from the log."""


# --- evolve: one handler per fact -----------------------------------------------------------


_STORY = 8  # moves kept per subtask and job
_MOVE_TEXT = {(m.old, m.new): f"{m.old._value_}->{m.new._value_}" for m in TASK_MOVES if not m.restart}
"""Each legal move of an attempt as its story tells it (one look-up checks the move and names it)."""


def _remember(history: list[tuple[int, str]], ts: int, what: str) -> None:
    history.append((ts, what))
    if len(history) > _STORY:
        del history[0]


def _reported(
    state: JobsState,
    job: JobRun,
    ex: Execution,
    env: Envelope,
    ev: UpdateTaskExecutionState,
    old: TaskState,
    new: TaskState,
) -> bool:
    """What a report of an attempt's move says of it (its state, error, TaskManager, slot and
    session), and the slot it takes or gives back: the current attempt's and a speculative
    one's alike. True when the move took a slot."""
    ex.state, ex.since = new, env.ts
    if ev.error is not None:
        ex.error = ev.error
    if ev.taskmanager is not None:
        ex.taskmanager, ex.slot = ev.taskmanager, ev.slot
    if ev.session is not None:
        ex.session = ev.session
    holds, held = new in HOLDS_SLOT, old in HOLDS_SLOT
    if holds and not held:
        ex.placed_epoch = env.epoch
        if ex.taskmanager is not None:
            # (a placement names the TaskManager and its slot together: slot is not None here)
            state.pool.take(ex.taskmanager, ex.slot, job.job_id, ex.id)  # type: ignore[arg-type]
            job.slot_taken_at = env.ts
            return True
    elif held and not holds:
        state.pool.give_back(ex.taskmanager, ex.slot, job.job_id, ex.id)
    return False


def _task_moved(state: JobsState, env: Envelope, ev: UpdateTaskExecutionState) -> None:
    """An attempt moved (nine facts in ten: written for speed)."""
    job = state.jobs.get(ev.job_id)
    if job is None:
        return
    vertex = job.vertices[ev.vertex_id]
    ex = vertex.subtasks[ev.subtask]
    if ex.attempt != ev.attempt and vertex.concurrent:
        other = next((o for o in vertex.concurrent.get(ev.subtask, ()) if o.attempt == ev.attempt), None)
        if other is not None:
            _concurrent_moved(state, job, vertex, other, env, ev)
            return
    old, new = ex.state, ev.state
    move = _MOVE_TEXT.get((old, new)) if ex.attempt == ev.attempt else None
    if move is None:  # raises: not a legal move
        check_task(ev.execution_id, old, new, ex.history, current=ex.attempt, attempt=ev.attempt)
    history = ex.history
    history.append((env.ts, f"{ex.attempt}: {move}"))
    if len(history) > _STORY:
        del history[0]
    if _reported(state, job, ex, env, ev, old, new) and not job.wait_until_placed:
        job.waiting_since = None
    if new == TaskState.FINISHED and old != TaskState.FINISHED:
        vertex.finished += 1
    started = new in STARTED_TASK
    if started is not (old in STARTED_TASK):
        vertex.started += 1 if started else -1


def _concurrent_moved(
    state: JobsState, job: JobRun, vertex: VertexRun, ex: Execution, env: Envelope, ev: UpdateTaskExecutionState
) -> None:
    """An attempt that runs besides its subtask's current one moved: its slot is taken or
    given back, but the vertex's counts are the current attempt's; once it ended, it is gone."""
    old, new = ex.state, ev.state
    check_task(ev.execution_id, old, new, ex.history, current=ex.attempt, attempt=ev.attempt)
    _remember(ex.history, env.ts, f"{ex.attempt}: {old._value_}->{new._value_} (speculative)")
    _reported(state, job, ex, env, ev, old, new)
    if new.terminal:
        others = vertex.concurrent[ex.subtask]
        others.remove(ex)
        if not others:
            del vertex.concurrent[ex.subtask]


def _speculated(state: JobsState, env: Envelope, ev: SpeculativeAttemptScheduled) -> None:
    """A subtask gets a speculative attempt besides its current one (ready to be placed)."""
    job = state.jobs[ev.job_id]
    vertex = job.vertices[ev.vertex_id]
    ex = vertex.subtasks[ev.subtask]
    taken = [ex.attempt, *(o.attempt for o in vertex.concurrent.get(ev.subtask, ()))]
    if ex.attempt != ev.original or ev.attempt <= max(taken) or ev.attempt <= vertex.highest.get(ev.subtask, -1):
        raise IllegalTransition(
            f"{ev.job_id}: a speculative attempt {ev.attempt} of {ev.vertex_id}[{ev.subtask}] beside attempt "
            f"{ev.original} (its current attempt is {ex.attempt}, attempts taken: {taken}): a speculative attempt "
            f"is numbered above every attempt of its subtask, beside the current one. Its story: {ex.history}"
        )
    spec = Execution(ev.vertex_id, ev.subtask, ev.attempt, since=env.ts, not_before=env.ts)
    _remember(ex.history, env.ts, f"{ex.attempt}: speculative attempt {ev.attempt} (ran {ev.elapsed_ms} ms)")
    vertex.concurrent.setdefault(ev.subtask, []).append(spec)
    vertex.highest[ev.subtask] = ev.attempt
    job.ready.append(spec)


def _won(state: JobsState, env: Envelope, ev: AttemptWon) -> None:
    """One of a subtask's concurrent attempts won: it becomes the current one (the others
    stay beside it until they are cancelled)."""
    job = state.jobs[ev.job_id]
    vertex = job.vertices[ev.vertex_id]
    ex = vertex.subtasks[ev.subtask]
    others = vertex.concurrent.get(ev.subtask, [])
    attempts = {o.attempt for o in [ex, *others]}
    if ev.attempt not in attempts or not set(ev.losers) <= attempts - {ev.attempt}:
        raise IllegalTransition(
            f"{ev.job_id}: attempt {ev.attempt} of {ev.vertex_id}[{ev.subtask}] won over {ev.losers}, "
            f"but its subtask's concurrent attempts are {sorted(attempts)}. Its story: {ex.history}"
        )
    _remember(ex.history, env.ts, f"{ev.attempt}: won over {ev.losers}")
    if ex.attempt == ev.attempt:
        return
    winner = next(o for o in others if o.attempt == ev.attempt)
    others.remove(winner)
    others.append(ex)
    _uncount(vertex, ex)
    ex.produced = False
    if winner.state == TaskState.FINISHED:
        vertex.finished += 1
    if winner.state in STARTED_TASK:
        vertex.started += 1
    job.by_id.pop(ex.id, None)  # (no longer current)
    vertex.subtasks[ev.subtask] = winner
    vertex.restarted += 1  # (consumers' descriptors name the winner's attempt)


def _uncount(vertex: VertexRun, ex: Execution) -> None:
    """Take an attempt that stops being its subtask's current one out of its vertex's counts
    (finished, started, produced)."""
    if ex.state == TaskState.FINISHED:
        vertex.finished -= 1
    if ex.state in STARTED_TASK:
        vertex.started -= 1
    if ex.produced:
        vertex.produced -= 1


def _produced(state: JobsState, env: Envelope, ev: ScheduleOrUpdateConsumers) -> None:
    """An attempt's partition is complete: its consumers may be deployable."""
    if (job := state.jobs.get(ev.job_id)) is None:
        return
    vertex = job.vertices[ev.vertex_id]
    ex = vertex.subtasks[ev.subtask]
    if ex.attempt != ev.attempt or ex.produced:
        return  # (of an attempt gone since, or said again)
    ex.produced = True
    vertex.produced += 1
    for edge in vertex.outputs:
        consumer = job.vertices[edge.target]
        if edge.exchange == "forward":
            job.ready.append(consumer.subtasks[ev.subtask])
        elif vertex.produced == len(vertex.subtasks):
            job.ready.extend(consumer.subtasks)


def _restarted(state: JobsState, env: Envelope, ev: TaskRestartScheduled) -> None:
    """A new attempt replaces the subtask's current one (a move of the table, as any other)."""
    job = state.jobs[ev.job_id]
    vertex = job.vertices[ev.vertex_id]
    ex = vertex.subtasks[ev.subtask]
    check_task(ex.id, ex.state, TaskState.CREATED, ex.history, current=ex.attempt, attempt=ev.attempt, restart=True)
    _remember(ex.history, env.ts, f"{ex.attempt}: restarted as attempt {ev.attempt}")
    if ex.state in HOLDS_SLOT:
        state.pool.give_back(ex.taskmanager, ex.slot, job.job_id, ex.id)
    _uncount(vertex, ex)
    job.by_id.pop(ex.id, None)  # (no longer current)
    ex.attempt, ex.state, ex.taskmanager, ex.slot, ex.seq = ev.attempt, TaskState.CREATED, None, None, 0
    vertex.restarted += 1
    ex.session = ex.placed_epoch = None
    ex.not_before, ex.produced, ex.since = ev.not_before, False, env.ts
    job.restarts = ev.restarts
    job.ready.append(ex)


def _coordinator_took(state: JobsState, env: Envelope, ev: OperatorEvent | RequestNextInputSplit) -> None:
    """A message a subtask sent its coordinator was taken: its number, so it is taken once
    (an operator event to a subtask changes nothing here)."""
    if type(ev) is OperatorEvent and not ev.to_coordinator:
        return
    job = state.jobs.get(ev.job_id)
    if job is not None and ev.seq:
        if isinstance(ev, OperatorEvent):
            ex, attempt = job.vertices[ev.operator_id].subtasks[ev.subtask], ev.attempt
        else:
            ex, attempt = job.vertices[ev.vertex_id].subtasks[ev.subtask], parse_execution_id(ev.execution_id)[2]
        if ex.attempt == attempt and ev.seq > ex.seq:
            ex.seq = ev.seq


def _submitted(state: JobsState, env: Envelope, ev: JobSubmitted) -> None:
    job = state.jobs[ev.job_id] = JobRun(
        ev.job_id, ev.graph, ev.code_blob, ev.module, ev.reply_to, ev.params, ev.splits, ev.storage_root, env.ts
    )
    kvreg.evolve(job.kvstate, ev)


def _built(state: JobsState, env: Envelope, ev: ExecutionGraphBuilt) -> None:
    _build(state.jobs[ev.job_id], ev.first_attempt)
    state.jobs[ev.job_id].floor = ev.first_attempt


def _renumbered(state: JobsState, env: Envelope, ev: AttemptsRenumbered) -> None:
    job = state.jobs[ev.job_id]
    job.floor = max(job.floor, ev.attempt_floor)


def _job_moved(state: JobsState, env: Envelope, ev: JobStatusChanged) -> None:
    job = state.jobs[ev.job_id]
    check_job(job.job_id, job.status, ev.status, job.history)
    _remember(job.history, env.ts, f"{job.status.value}->{ev.status.value}")
    job.status = ev.status
    if ev.reason is not None:
        job.reason = ev.reason
    if ev.status in TERMINAL_JOB:
        job.ended_at = env.ts
        job.ready.clear()


def _waiting(state: JobsState, env: Envelope, ev: JobWaitingForSlots) -> None:
    job = state.jobs[ev.job_id]
    if job.waiting_since is None:
        job.waiting_since, job.wait_until_placed = env.ts, ev.until_placed


def _slots_found(state: JobsState, env: Envelope, ev: JobSlotsFound) -> None:
    state.jobs[ev.job_id].waiting_since = None


def _queryable(
    state: JobsState, env: Envelope, ev: NotifyKvStateRegistered | NotifyKvStateUnregistered | JobDisposed
) -> None:
    """Queryable state: the job's KvState registry (services/kvstate/registry.py)."""
    if (job := state.jobs.get(ev.job_id)) is not None:
        kvreg.evolve(job.kvstate, ev)


def _nothing(state: JobsState, env: Envelope, ev: Event) -> None:
    """A fact of a job's stream that changes nothing here: a refused queryable-state
    notification, or what a coordinator sent or checkpointed (its coordinator folds that)."""


_HANDLERS: dict[type[Event], Callable[[JobsState, Envelope, Any], None]] = {
    UpdateTaskExecutionState: _task_moved,
    ScheduleOrUpdateConsumers: _produced,
    TaskRestartScheduled: _restarted,
    SpeculativeAttemptScheduled: _speculated,
    AttemptWon: _won,
    OperatorEvent: _coordinator_took,
    RequestNextInputSplit: _coordinator_took,
    JobSubmitted: _submitted,
    ExecutionGraphBuilt: _built,
    AttemptsRenumbered: _renumbered,
    JobStatusChanged: _job_moved,
    JobWaitingForSlots: _waiting,
    JobSlotsFound: _slots_found,
    NotifyKvStateRegistered: _queryable,
    NotifyKvStateUnregistered: _queryable,
    JobDisposed: _queryable,
    KvStateNotificationRefused: _nothing,
    NextInputSplit: _nothing,
    CoordinatorCheckpointed: _nothing,
}
"""Each fact of a job's stream -> how it changes the state (as dask's handlers, keyed)."""


def evolve(state: JobsState, env: Envelope) -> JobsState:
    """Apply one job fact to ``state`` in place (and return it). A fact that is not a legal
    move (services/jobs/machine.py), or that no handler folds, raises IllegalTransition
    (the first with the subtask's or job's story)."""
    ev = env.event
    try:
        handler = _HANDLERS[type(ev)]
    except KeyError:
        entry = env.id or "(not committed)"
        raise IllegalTransition(
            f"{ev.TYPE} is not a fact of a job's stream: evolve has no handler for it (the "
            f"handlers: services/jobs/state.py _HANDLERS; entry {entry})"
        ) from None
    handler(state, env, ev)
    return state


def _build(job: JobRun, first_attempt: int = 0) -> None:
    """Expand every vertex into its subtasks and wire the edges: linear in the number of
    subtasks (an all-to-all edge is one group per consumer, never producers x consumers)."""
    graph = job.graph
    job.by_id.clear()  # (of executions built before, if any)
    inputs: dict[str, list[JobEdge]] = {v.name: [] for v in graph.vertices}
    outputs: dict[str, list[JobEdge]] = {v.name: [] for v in graph.vertices}
    for e in graph.edges:
        inputs[e.target].append(e)
        outputs[e.source].append(e)
    for v in graph.vertices:
        subtasks = [Execution(v.name, i, first_attempt, since=job.submitted_at) for i in range(v.parallelism)]
        job.vertices[v.name] = VertexRun(v, inputs[v.name], outputs[v.name], subtasks)
        if not inputs[v.name]:
            job.ready.extend(subtasks)
    job.built = True
