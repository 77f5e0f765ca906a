"""Losses and time, pure: a TaskManager lost, executions left on a registration that is gone
(orphans), the log's server restarted, jobs that waited too long for slots. Handlers of the
jobs core (services/jobs/core.py ``decide``); each touches several jobs, one decision per job
(``Decision.jobs``).
"""

from __future__ import annotations

from sluice.events import AttemptsRenumbered, TaskRestartScheduled, TaskState
from sluice.services.common.decision import Decision

from .failures import fail_job, gone, maybe_complete
from .machine import HOLDS_SLOT, LIVE_JOB, STOPPING_JOB, TERMINAL_JOB
from .recorder import Recorder
from .speculation import beside, drop, next_attempt
from .state import JobsState
from .stimuli import LogRestart, Orphans, SlotWaits, TaskManagerGone

__all__ = ["taskmanager_gone", "orphans", "log_restarted", "slot_waits"]


def taskmanager_gone(state: JobsState, s: TaskManagerGone, now: int) -> Decision:
    """Every execution on a lost TaskManager (``session``: only on that registration of it)
    fails, and may be restarted elsewhere."""
    resource_id, reason, config, session = s.resource_id, s.reason, s.config, s.session
    out = Decision(now=now)
    for job in list(state.jobs.values()):
        if job.status in TERMINAL_JOB:
            continue
        rec = Recorder(state, job.job_id, now)
        for ex in list(job.executions()):
            if (
                ex.taskmanager == resource_id
                and ex.state in HOLDS_SLOT
                and (session is None or ex.session is None or ex.session == session)
            ):
                gone(rec, job, ex, f"TaskManager {resource_id} was lost ({reason})", config)
        maybe_complete(rec, job)
        if rec.decision:
            out.jobs.append(rec.decision)
    return out


def orphans(state: JobsState, s: Orphans, now: int) -> Decision:
    """Executions placed on a TaskManager registration that is gone fail: the leader that
    saw it go died before it failed them. Gone: the TaskManager is not registered, or
    registered again as a new session, or registered again (even under the same session)
    at a later epoch than the attempt was placed at, so a loss ended the registration the
    attempt was placed on. ``active``: resource id -> current session; ``registered``:
    resource id -> the epoch its current registration began at."""
    active, reasons, config = s.active, s.reasons, s.config
    out = Decision(now=now)
    since = s.registered or {}
    for job in list(state.jobs.values()):
        if job.status in TERMINAL_JOB:
            continue
        rec = Recorder(state, job.job_id, now)
        for ex in list(job.executions()):
            if ex.state not in HOLDS_SLOT or ex.taskmanager is None:
                continue
            current = active.get(ex.taskmanager)
            renewed = ex.placed_epoch is not None and ex.placed_epoch < since.get(ex.taskmanager, 0)
            if current is not None and (ex.session is None or ex.session == current) and not renewed:
                continue
            if current is not None and renewed:
                why = (
                    f"it registered again at epoch {since[ex.taskmanager]}, after a loss; the attempt was placed "
                    f"at epoch {ex.placed_epoch}, on the registration that loss ended"
                )
            else:
                why = reasons.get(ex.taskmanager) or "not registered"
            gone(rec, job, ex, f"TaskManager {ex.taskmanager} was lost ({why})", config)
        maybe_complete(rec, job)
        if rec.decision:
            out.jobs.append(rec.decision)
    return out


def log_restarted(state: JobsState, s: LogRestart, now: int) -> Decision:
    """The log's server restarted and may have lost its last writes: no attempt that was
    not finished is trusted. Each runs again (not counted against the restart strategy:
    the cluster, not the job, failed) as an attempt numbered at least ``attempt_floor`` (the
    server's clock), which no attempt started before the restart can have had: writes
    that were lost may have deployed attempts the log no longer knows of."""
    reason, attempt_floor = s.reason, s.attempt_floor
    out = Decision(now=now)
    for job in list(state.jobs.values()):
        if job.status in TERMINAL_JOB or not job.built or job.floor >= attempt_floor:
            continue  # ended, or renumbered at this floor already (recovery resumed by a new leader)
        rec = Recorder(state, job.job_id, now)
        rec.fact(AttemptsRenumbered(job.job_id, attempt_floor, reason))
        ending = job.status in STOPPING_JOB
        speculating = job.speculating
        for ex in list(job.executions()):
            if speculating and not ending and beside(job, ex):
                drop(rec, ex, reason)  # (the current attempt's restart replaces it)
                continue
            if speculating:
                floor = max(attempt_floor, next_attempt(job, ex))
            else:
                floor = attempt_floor
            if ex.state == TaskState.CANCELING or (ending and ex.state in HOLDS_SLOT):
                rec.move(ex, TaskState.CANCELED, reason)
            elif ending:
                continue
            elif ex.state in HOLDS_SLOT:
                rec.move(ex, TaskState.FAILED, reason)
                rec.fact(
                    TaskRestartScheduled(
                        job.job_id, ex.vertex, ex.subtask, max(ex.attempt + 1, floor), now, job.restarts
                    )
                )
            elif ex.state == TaskState.CREATED:
                rec.fact(
                    TaskRestartScheduled(
                        job.job_id,
                        ex.vertex,
                        ex.subtask,
                        max(ex.attempt + 1, floor),
                        max(now, ex.not_before),
                        job.restarts,
                    )
                )
        maybe_complete(rec, job)
        if rec.decision:
            out.jobs.append(rec.decision)
    return out


def slot_waits(state: JobsState, s: SlotWaits, now: int) -> Decision:
    """Jobs that waited too long for slots fail: counted from the wait's start or the job's
    last slot taken, whichever is later (a job that takes slots makes progress), and from
    ``since`` at the earliest (when a leader that rebuilt jobs while serving could schedule
    again). The leader measures the wait on its monotonic ``clock`` from when it first saw
    it so (``timers``: services/jobs/timers.py; it looks only once it can schedule, so
    ``since`` is then implied); without ``timers`` (the core on its own, one clock for
    everything) the log's stamps are compared with ``now``."""
    config, total_slots, since, timers, clock = s.config, s.total_slots, s.since, s.timers, s.clock
    out = Decision(now=now)
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
            rec = Recorder(state, job.job_id, now)
            pending = sum(1 for ex in job.executions() if ex.state == TaskState.CREATED)
            fail_job(
                rec,
                job,
                f"waited {waited // 1000} s for free slots ({pending} tasks not deployed; the "
                f"cluster has {total_slots} slots): add TaskManagers (sluice scale) or lower the "
                "parallelism",
                "no slots",
            )
            out.jobs.append(rec.decision)
    return out
