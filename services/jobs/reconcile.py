"""Reconciliation, pure: a TaskManager's slot report against the leader's view of it, as
Flink's JobMaster reconciles a TaskExecutor's execution deployment report.

A TaskManager reports, with every registration and heartbeat, the attempts it holds and
the final states it has not yet seen confirmed. The leader compares that with the
attempts it placed there:

* **missing**: an attempt it thinks is running there (INITIALIZING, RUNNING, CANCELING)
  that the TaskManager does not hold and has no final state for (its end was never
  recorded anywhere) fails, and is restarted as any failure is;
* **unknown**: an attempt the TaskManager holds that the leader does not count (an older
  attempt, one that failed or was cancelled, another TaskManager's, a job it does not
  run) is cancelled there; one the leader has as FINISHED is released there instead (a
  cancel would delete the output its consumers read); one the leader is cancelling is
  told again (its CancelTask was lost);
* **lost final**: a final state the TaskManager reports for an attempt the leader still
  has running is accepted, as if its report had arrived, once the job's inbox was read to
  its end after the report (so it is lost, not late);
* **recorded**: final states the log already has are confirmed, so the TaskManager can
  forget them;
* **deployment timeout**: an attempt DEPLOYING for longer than the timeout that its
  TaskManager does not report holding fails (its SubmitTask or the answer was lost).

Reports travel on the cluster inbox, the attempts' own reports on their jobs' inboxes,
so one may overtake the other: a difference must persist over two reports and a grace
period (the heartbeat timeout) before the leader acts on it. An attempt is found missing
only on a report its TaskManager sent after it last heard of the attempt: the leader reads
every inbox in one call, so a report read after a read that reached the end of the
cluster inbox was appended after everything that read saw (``Memory.read``, ``heard``). A
backlog of old heartbeats never fails a running attempt. What the leader remembers
between reports (``Memory``, services/jobs/slot_memory.py) is soft state, like the
heartbeat monitor: a new leader starts it afresh.

One door: ``decide(state, stimulus, now) -> Decision`` (services/common/decision.py), the
stimulus a ``SlotReport``, ``LostFinals`` or ``DeploymentTimeouts``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sluice.events import (
    AttemptReport,
    CancelTask,
    Event,
    ScheduleOrUpdateConsumers,
    TaskState,
    UpdateTaskExecutionState,
)
from sluice.services.common.decision import Address, Decision, Note, Recorded, Send

from .core import _update
from .failures import fail, gone, maybe_complete
from .recorder import Recorder
from .slot_memory import Memory, PerTaskManager, Seen, split_task_id
from .slot_pool import SlotPool
from .speculation import concurrent_message
from .state import TERMINAL_JOB, Execution, JobRun, JobsState
from .stimuli import JobsConfig

__all__ = ["Memory", "SlotReport", "LostFinals", "DeploymentTimeouts", "decide"]

_WATCHED = (TaskState.INITIALIZING, TaskState.RUNNING, TaskState.CANCELING)
"""States in which an attempt must be in its TaskManager's report (DEPLOYING: the
TaskManager may not have its SubmitTask yet; the deployment timeout covers it)."""


@dataclass(frozen=True)
class SlotReport:
    """TaskManager ``resource_id`` (registered as ``session``) reported the attempts it holds
    and the final states not yet confirmed. The grace period runs on ``clock``, the leader's
    monotonic clock (None: ``now``, for the core on its own): a wall clock that steps would
    act on a difference early, or late."""

    memory: Memory
    resource_id: str
    session: str
    report: list[AttemptReport]
    grace_ms: int
    config: JobsConfig
    clock: int | None = None


@dataclass(frozen=True)
class LostFinals:
    """A read's messages were handled: final states whose own reports are lost are taken
    (``caught_up(job_id)``: the job's inbox was read to its end)."""

    memory: Memory
    caught_up: Callable[[str], bool]
    config: JobsConfig


@dataclass(frozen=True)
class DeploymentTimeouts:
    """Time passed: deployments unanswered for ``timeout_ms`` (on ``clock``; None: ``now``) fail."""

    memory: Memory
    timeout_ms: int
    config: JobsConfig
    clock: int | None = None


def decide(state: JobsState, stimulus: SlotReport | LostFinals | DeploymentTimeouts, now: int) -> Decision:
    """Reconciliation's one door. A slot report's decision sends to the TaskManager (cancels,
    releases) and says what it may forget (``Recorded``); every stimulus's job facts are in
    ``Decision.jobs``, one decision per job."""
    s = stimulus
    if type(s) is SlotReport:
        return _reconcile(state, s.memory, s.resource_id, s.session, s.report, now, s.grace_ms, s.config, clock=s.clock)
    if type(s) is LostFinals:
        return Decision(now=now, jobs=_accept_lost_finals(state, s.memory, s.caught_up, now, s.config))
    if type(s) is DeploymentTimeouts:
        return Decision(now=now, jobs=_deployment_timeouts(state, s.memory, now, s.timeout_ms, s.config, clock=s.clock))
    raise TypeError(f"{type(s).__name__} is not a stimulus of reconciliation")


def _reconcile(
    state: JobsState,
    memory: Memory,
    resource_id: str,
    session: str,
    report: list[AttemptReport],
    now: int,
    grace_ms: int,
    config: JobsConfig,
    *,
    clock: int | None = None,
) -> Decision:
    """Compare TaskManager ``resource_id`` (registered as ``session``)'s slot report with the
    attempts placed on it; the state is changed by the decisions, as they are decided
    (at ``now``: the wall clock, their facts' time). The grace period runs on ``clock``, the
    leader's monotonic clock (None: ``now``, for the core on its own): a wall clock that
    steps would act on a difference early, or late."""
    clock = now if clock is None else clock
    cancels: list[Event] = []
    release: list[Event] = []
    recorded: list[str] = []
    notes: list[str] = []
    mem = memory.taskmanagers.setdefault(resource_id, PerTaskManager())
    previous, mem.differences = mem.differences, {}
    held = {r.task_id: r for r in report if not r.state.terminal}
    finals = {r.task_id: r for r in report if r.state.terminal}
    recorders: dict[str, Recorder] = {}

    def due(kind: str, task_id: str) -> bool:
        """Whether a difference has lasted long enough to act on (and remember it)."""
        seen = previous.get((kind, task_id))
        seen = Seen(seen.since, seen.reports + 1) if seen is not None else Seen(clock)
        mem.differences[(kind, task_id)] = seen
        return seen.reports >= 2 and clock - seen.since >= grace_ms

    def cancel_due(task_id: str) -> bool:
        """Whether a cancel may be sent for it now (once per grace period; and remember it)."""
        last = mem.cancelled.get(task_id)
        if last is not None and clock - last < grace_ms:
            return False
        mem.cancelled[task_id] = clock
        return True

    def recorder(job_id: str) -> Recorder:
        if job_id not in recorders:
            recorders[job_id] = Recorder(state, job_id, now)
        return recorders[job_id]

    # Attempts placed here (they hold its slots): missing ones, and deployments not taken.
    used = state.pool.used
    for slot in sorted(state.pool.by_taskmanager.get(resource_id, ())):
        holders = used.get((resource_id, slot), ())
        # A copy (a failure gives the slot back), in order; nearly always one holder: no sort.
        for job_id, eid in sorted(holders) if len(holders) > 1 else list(holders):
            task_id = f"{job_id}/{eid}"
            if task_id in held or task_id in finals:
                continue  # reported (looked at below): nearly every attempt, so first and cheaply
            job = state.jobs.get(job_id)
            ex = job.attempt_of(eid) if job is not None and job.status not in TERMINAL_JOB else None
            if job is None or ex is None or ex.taskmanager != resource_id:
                continue
            if ex.session is not None and ex.session != session:
                continue  # an earlier registration's: the TaskManager-lost path fails it
            kind = "deploying" if ex.state == TaskState.DEPLOYING else "missing" if ex.state in _WATCHED else None
            if kind is None:
                continue
            if not memory.evidence(task_id):  # an old report: it says nothing either way
                if (kind, task_id) in previous:
                    mem.differences[(kind, task_id)] = previous[(kind, task_id)]
                continue
            if not due(kind, task_id) or kind == "deploying":  # (the deployment timeout decides)
                continue
            rec = recorder(job_id)
            gone(
                rec,
                job,
                ex,
                f"TaskManager {resource_id} no longer holds it and never reported its end "
                "(its slot report does not list it)",
                config,
            )
            maybe_complete(rec, job)
            notes.append(f"{task_id} missing on {resource_id}: failed")

    # Final states reported here: confirmed when the log has them; otherwise kept until the
    # job's inbox has been read to its end since (``accept_lost_finals``).
    for task_id in [t for t in memory.finals_on.get(resource_id, ()) if t not in finals]:
        memory.drop_final(task_id)  # no longer reported: confirmed, or dropped with its TaskManager's tasks
    for task_id, line in finals.items():
        job_id, execution_id = split_task_id(task_id)
        found = state.jobs.get(job_id)
        ex = found.attempt_of(execution_id) if found is not None else None
        if (
            found is None
            or found.status in TERMINAL_JOB
            or ex is None
            or ex.state.terminal
            or ex.taskmanager != resource_id
        ):
            recorded.append(task_id)  # the log has its end, or does not count the attempt
            memory.drop_final(task_id)
            continue
        memory.keep_final(task_id, resource_id, line)

    # Attempts held here that the leader does not count.
    for task_id in held:
        job_id, execution_id = split_task_id(task_id)
        found = state.jobs.get(job_id)
        ex = found.attempt_of(execution_id) if found is not None else None
        if ex is not None and ex.taskmanager == resource_id and ex.state == TaskState.CANCELING:
            # Still held though the leader cancelled it: the CancelTask was lost, say it again.
            if due("cancelling", task_id) and cancel_due(task_id):
                cancels.append(
                    CancelTask(job_id, execution_id, "cancelled (said again: the TaskManager still holds it)")
                )
            continue
        if ex is not None and ex.taskmanager == resource_id and not ex.state.terminal:
            continue  # as it should be
        if ex is not None and ex.taskmanager == resource_id and ex.state == TaskState.FINISHED:
            if due("finished", task_id):  # no TaskManager named: the leader's release, not a worker's report
                release.append(
                    UpdateTaskExecutionState(
                        job_id, execution_id, TaskState.FINISHED, None, ex.vertex, ex.subtask, ex.attempt, None, ex.slot
                    )
                )
            continue
        if not due("unknown", task_id) or not cancel_due(task_id):
            continue
        why = (
            "its job is not running"
            if found is None or found.status in TERMINAL_JOB
            else "the leader does not count this attempt (it failed, was cancelled, or was replaced)"
        )
        cancels.append(CancelTask(job_id, execution_id, f"reconciled with the slot report of {resource_id}: {why}"))
        notes.append(f"{task_id} unknown on {resource_id}: cancelled")
    mem.cancelled = {t: at for t, at in mem.cancelled.items() if t in held}
    to = Address.taskmanager(resource_id)
    out = Decision(
        sends=[Send(to, m) for m in (*cancels, *release)],
        now=now,
        jobs=[rec.decision for rec in recorders.values() if rec.decision],
    )
    out.instructions += [Note(n) for n in notes]
    if recorded:
        out.instructions.append(Recorded(tuple(recorded)))
    return out


def _accept_lost_finals(
    state: JobsState, memory: Memory, caught_up: Callable[[str], bool], now: int, config: JobsConfig
) -> list[Decision]:
    """Final states TaskManagers report for attempts the leader still has running, whose
    own reports are lost: taken from the slot reports. Lost, not late: an attempt's final
    report goes to its job's inbox before its TaskManager lists it, so once the leader has
    read that inbox to its end (``caught_up(job_id)``, in a read after the one that brought
    the slot report) and the attempt still runs, the report is not coming. Taking it
    earlier would overtake what the attempt sent before it (its queryable state, its
    partition being ready). Called after a read's messages were handled."""
    out: dict[str, Recorder] = {}
    notes = []
    ready: dict[str, bool] = {}
    if not any(caught_up(job_id) for job_id in memory.final_jobs):
        return []  # every final waits for its job's inbox: nothing to look at (caught_up asks, nothing more)
    for task_id, (seen_in, resource_id, line) in list(memory.finals.items()):
        if seen_in >= memory.batch:
            continue
        job_id, execution_id = split_task_id(task_id)
        if job_id not in ready:
            ready[job_id] = caught_up(job_id)
        if not ready[job_id]:
            # Looked at (or forgotten, if its attempt ended meanwhile) once caught up: a leader
            # behind on a busy job's inbox does not re-examine every final of it each step.
            continue
        job = state.jobs.get(job_id)
        ex = job.attempt_of(execution_id) if job is not None and job.status not in TERMINAL_JOB else None
        memory.drop_final(task_id)
        if job is None or ex is None or ex.state.terminal or ex.taskmanager != resource_id:
            continue
        rec = out.setdefault(job_id, Recorder(state, job_id, now))
        final, error = line.state, line.error
        if final == TaskState.FINISHED and _state_lost(job, ex):
            # Its queryable state's registration was lost with its reports (a restart of
            # Redis that lost its last writes): finished without it, the job would serve
            # some keys from nowhere. It runs again, as a failed attempt does.
            final, error = (
                TaskState.FAILED,
                (
                    "it finished, but its queryable state's registration was lost with "
                    "its reports: it runs again to register it"
                ),
            )
        msg = UpdateTaskExecutionState(
            job_id, execution_id, final, error, ex.vertex, ex.subtask, ex.attempt, resource_id, ex.slot
        )
        if job.speculating and concurrent_message(rec, job, msg):
            maybe_complete(rec, job)  # (an attempt beside its subtask's current one: services/jobs/speculation.py)
            notes.append(task_id)
            continue
        if final == TaskState.FINISHED and job.vertices[ex.vertex].outputs and not ex.produced:
            # A finished producer wrote its partition (its worker says so before it finishes):
            # that report was lost too, and consumers wait for it.
            rec.fact(ScheduleOrUpdateConsumers(job_id, ex.id, ex.vertex, ex.subtask, ex.attempt))
        _update(rec, job, msg, config)
        notes.append(task_id)
    memory.accepted += notes
    return [rec.decision for rec in out.values() if rec.decision]


def _state_lost(job: JobRun, ex: Execution) -> bool:
    """Whether ``ex`` publishes queryable state and its registration is not in the log."""
    name = job.vertices[ex.vertex].spec.queryable
    if name is None:
        return False
    loc = job.kvstate.locations.get(name)
    return loc is None or not any(e.execution_id == ex.id for e in loc.entries.values())


def _deployment_timeouts(
    state: JobsState, memory: Memory, now: int, timeout_ms: int, config: JobsConfig, *, clock: int | None = None
) -> list[Decision]:
    """Attempts DEPLOYING for longer than ``timeout_ms`` (on ``clock``, the leader's monotonic
    clock, from their deployment as ``Memory.deployed`` has it, and from this leader's start
    at the earliest; None: ``now``, the core on its own) whose TaskManager's reports, sent
    since the deployment, go on not
    listing them (held or ended) fail, and are restarted as any failure is; the TaskManager
    is told to cancel them in case they arrive late. A TaskManager that sends no report is
    left to its heartbeat timeout.

    Only the attempts the reports go on not listing (``Memory.unanswered``) are looked at,
    not every attempt holding a slot (scanning 10,000 of them each second cost the leader a
    tenth of its time), and they are failed in the order of the slots they hold, as a scan
    of the pool would. Their facts are decided at ``now`` (the wall clock: their time)."""
    one_clock = clock is None
    clock = now if clock is None else clock
    due: list[tuple[str, int, str, str]] = []
    for tm, seen_there in memory.taskmanagers.items():
        for (kind, task_id), seen in seen_there.differences.items():
            if kind != "deploying" or seen.reports < 2:
                continue
            job_id, eid = split_task_id(task_id)
            ex = _timed_out(state, memory, clock, timeout_ms, tm, job_id, eid, one_clock)
            if ex is not None:
                slot = _first_slot(state.pool, tm, job_id, eid, ex.slot)
                if slot is not None:
                    due.append((tm, slot, job_id, eid))
    out: dict[str, Recorder] = {}
    for tm, _slot, job_id, eid in sorted(due):
        ex = _timed_out(
            state, memory, clock, timeout_ms, tm, job_id, eid, one_clock
        )  # again: one failed may end its job
        if ex is None:
            continue
        job = state.jobs[job_id]
        rec = out.setdefault(job_id, Recorder(state, job_id, now))
        # (sent before it fails: a restart renumbers ex)
        rec.send(Address.taskmanager(tm), CancelTask(job_id, eid, "deployment timed out"))
        fail(
            rec,
            job,
            ex,
            f"deployment to TaskManager {tm} not acknowledged within {timeout_ms // 1000} s "
            "(its SubmitTask or the answer was lost)",
            config,
        )
        maybe_complete(rec, job)
    memory.keep(state.pool.placed)
    return [rec.decision for rec in out.values() if rec.decision]


def _timed_out(
    state: JobsState,
    memory: Memory,
    clock: int,
    timeout_ms: int,
    tm: str,
    job_id: str,
    eid: str,
    one_clock: bool = False,
) -> Execution | None:
    """The attempt, if its deployment to ``tm`` has gone unanswered for too long (on ``clock``;
    ``one_clock``: the log's times are on it too, so a deployment not in ``Memory.deployed``
    counts from its stamp)."""
    job = state.jobs.get(job_id)
    ex = job.attempt_of(eid) if job is not None and job.status not in TERMINAL_JOB else None
    if ex is None or ex.state != TaskState.DEPLOYING or ex.taskmanager != tm:
        return None
    task_id = f"{job_id}/{eid}"
    deployed = memory.deployed.get(task_id, ex.since if one_clock else 0)
    if clock - max(deployed, memory.leading_since) <= timeout_ms or not memory.unanswered(tm, task_id):
        return None
    return ex


def _first_slot(pool: SlotPool, tm: str, job_id: str, eid: str, slot: int | None) -> int | None:
    """The lowest slot of ``tm`` the attempt holds: in a correct log, its only one, ``slot``."""
    held = pool.placed.get(f"{job_id}/{eid}", 0)
    if held == 0:
        return None
    if held == 1 and slot is not None and (job_id, eid) in pool.used.get((tm, slot), ()):
        return slot
    return min(
        (s for s in pool.by_taskmanager.get(tm, ()) if (job_id, eid) in pool.used.get((tm, s), ())), default=None
    )
