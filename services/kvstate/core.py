"""The KvState registry's decisions, pure: which notifications are accepted (and become
facts), which are refused (and why), and what a task's end releases.

The rules are Flink's ``KvStateLocationRegistry`` (see ``registry``), as events:

- the first registration of a name creates its location; later ones (same vertex) add
  or replace key-group ranges (a restarted attempt replaces its range's entry);
- a registration of a name that another job vertex holds is a clash: the registering
  vertex fails without restart, and the reason names both vertex ids;
- unregistering a name that is not known is an error naming the likely
  registration/unregistration race; unregistering from the wrong vertex is an error;
- a key-group range outside ``0..max parallelism-1`` is an error;
- a notification for a job that is not running gets "job not found".

``decide(job, notification, now)`` returns a ``Decision`` (services/common/decision.py).
Refusals become a ``KvStateNotificationRefused`` fact and a ``Note`` for the JobManager's
log; a clash adds a ``FailVertex``; none raises. Registrations also carry the attempt that registered (Sluice's addition
to Flink's message): an attempt that is not the subtask's current, live one is refused,
and when an attempt fails or is cancelled (or the job fails or is cancelled) the leader
records its unregistration itself (``released``), in the same decision that records the
failure, so a restarted attempt's registration can never be overtaken by it. A FINISHED
task keeps its registration: a finished batch job's state stays queryable until the job
is disposed (``dispose``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from sluice.events import (
    DisposeJob,
    Event,
    JobDisposed,
    JobRefused,
    JobStatusChanged,
    KeyGroupRange,
    KvStateNotificationRefused,
    NotifyKvStateRegistered,
    NotifyKvStateUnregistered,
    UpdateTaskExecutionState,
)
from sluice.services.common.decision import Decision, FailVertex, Note
from sluice.services.jobs.machine import ABORTED_JOB, ABORTED_TASK, LIVE_JOB, LIVE_TASK, TERMINAL_JOB

from .registry import KvStateEntry, KvStateLocation

if TYPE_CHECKING:
    from sluice.services.jobs.state import JobRun, JobsState

__all__ = ["decide", "dispose", "released"]


def decide(job: JobRun | None, msg: NotifyKvStateRegistered | NotifyKvStateUnregistered, now: int = 0) -> Decision:
    """The registry's door: what a notification to ``job`` (None: its job is not known) causes."""
    job_id = job.job_id if job is not None else msg.job_id
    kind = msg.TYPE
    if job is None or msg.job_id != job_id or job.status not in LIVE_JOB:
        why = "no such job" if job is None or msg.job_id != job_id else f"it is {job.status.value}"
        return _refuse(
            job, job_id, msg, f"job not found: {msg.job_id} ({why}); {kind} for {msg.registration_name!r} ignored"
        )
    maxp = job.graph.max_parallelism
    r = msg.key_group_range
    if not 0 <= r.start <= r.end < maxp:
        return _refuse(
            job,
            job_id,
            msg,
            f"key-group range {r.start}..{r.end} of {msg.registration_name!r} is outside "
            f"0..{maxp - 1} (the job's max parallelism is {maxp})",
        )
    loc = job.kvstate.locations.get(msg.registration_name)
    if isinstance(msg, NotifyKvStateRegistered):
        return _register(job, msg, loc)
    if loc is None:
        return _refuse(
            job,
            job_id,
            msg,
            f"unknown registration name {msg.registration_name!r} in job {job_id}: "
            "probably a registration/unregistration race (the unregistration overtook "
            "the registration, or the state was unregistered already)",
        )
    if loc.vertex != msg.vertex_id:
        return _refuse(
            job,
            job_id,
            msg,
            f"vertex {msg.vertex_id!r} cannot unregister KvState "
            f"{msg.registration_name!r}: another operator ({loc.vertex!r}) registered it",
        )
    return Decision(
        [NotifyKvStateUnregistered(job_id, msg.vertex_id, r, msg.registration_name, _retired(loc, r.start, r.end))]
    )


def _register(job: JobRun, msg: NotifyKvStateRegistered, loc: KvStateLocation | None) -> Decision:
    name = msg.registration_name
    vertex = job.vertices.get(msg.vertex_id)
    if vertex is None:
        return _refuse(
            job,
            job.job_id,
            msg,
            f"unknown job vertex {msg.vertex_id!r} registered KvState {name!r} "
            f"(the job's vertices: {', '.join(map(repr, job.vertices))})",
        )
    ex = None
    if msg.execution_id is not None:
        ex = job.current(msg.execution_id)
        if ex is None or ex.vertex != msg.vertex_id or ex.state not in LIVE_TASK:
            now = f"{ex.id} {ex.state.value}" if ex is not None else "no such attempt"
            return _refuse(
                job,
                job.job_id,
                msg,
                f"registration of {name!r} by {msg.execution_id} is stale (current: {now}); ignored",
            )
    if loc is not None and loc.vertex != msg.vertex_id:
        reason = (
            f"registration name clash: vertex {msg.vertex_id!r} registered KvState {name!r}, which vertex "
            f"{loc.vertex!r} has already registered; {msg.vertex_id!r} fails without restart (give each "
            "queryable vertex its own name)"
        )
        v = _refuse(job, job.job_id, msg, reason)
        v.instructions.append(FailVertex(msg.vertex_id, ex.id if ex is not None else None, reason))
        return v
    if ex is not None and msg.execution_id != ex.id:
        msg = replace(msg, execution_id=ex.id)  # recorded under the attempt's own id
    return Decision([msg])


def _refuse(
    job: JobRun | None, job_id: str, msg: NotifyKvStateRegistered | NotifyKvStateUnregistered, reason: str
) -> Decision:
    facts: list[Event] = []
    if job is not None:
        facts.append(KvStateNotificationRefused(job_id, msg.TYPE, msg.vertex_id, msg.registration_name, reason))
    return Decision(facts, instructions=[Note(reason)])


def _retired(loc: KvStateLocation, start: int, end: int) -> list[str]:
    """State ids no range of ``loc`` points to once ``start..end`` is unregistered."""
    hit = {e.state_id for e in loc.entries.values() if e.start <= end and e.end >= start}
    kept = {e.state_id for e in loc.entries.values() if e.start < start or e.end > end}
    return sorted(hit - kept)


def released(job: JobRun, ev: Event) -> list[Event]:
    """The unregistrations a just-recorded fact causes: an attempt that failed or was
    cancelled drops what it registered; a job that failed or was cancelled drops everything."""
    pick: Callable[[KvStateEntry], bool]
    if type(ev) is UpdateTaskExecutionState and ev.state in ABORTED_TASK:
        pick = lambda e: e.execution_id == ev.execution_id
    elif type(ev) is JobStatusChanged and ev.status in ABORTED_JOB:
        pick = lambda e: True
    else:
        return []
    out: list[Event] = []
    for name, loc in sorted(job.kvstate.locations.items()):
        entries: list[KvStateEntry] = [e for _, e in sorted(loc.entries.items()) if pick(e)]
        going = {(e.start, e.end) for e in entries}
        still_used = {e.state_id for key, e in loc.entries.items() if key not in going}
        for e in entries:
            retired = [] if e.state_id in still_used else [e.state_id]  # another range still serves it
            out.append(NotifyKvStateUnregistered(job.job_id, loc.vertex, KeyGroupRange(e.start, e.end), name, retired))
    return out


def dispose(state: JobsState, msg: DisposeJob) -> tuple[list[Event], Event]:
    """(facts for the job's stream, the reply) for a request to release a job's queryable state."""
    job = state.jobs.get(msg.job_id)
    if job is None:
        return [], JobRefused(
            msg.job_id, f"job not found: {msg.job_id} (no such job in this cluster; `sluice list` shows the jobs)"
        )
    if job.status not in TERMINAL_JOB:
        return [], JobRefused(
            msg.job_id,
            f"job {msg.job_id} is {job.status.value}: its state is still in use; "
            f"cancel it first (sluice cancel {msg.job_id}) or wait until it ends",
        )
    done = JobDisposed(msg.job_id, sorted(job.kvstate.locations), sorted(job.kvstate.state_ids))
    return [done], done
