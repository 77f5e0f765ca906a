"""Scheduling, pure: a job's ready executions deployed onto free slots, a TaskManager's
at a time (the one with the most free slots, so a vertex spreads over TaskManagers)."""

from __future__ import annotations

from sluice.events import JobSlotsFound, JobWaitingForSlots, SubmitTask, TaskState, UpdateTaskExecutionState
from sluice.services.common.decision import Address, Decision

from .descriptor import descriptor
from .machine import LIVE_JOB
from .recorder import Recorder
from .speculation import avoid
from .state import Execution, JobRun, JobsState
from .stimuli import FreeSlots, Schedule

__all__ = ["schedule", "MAX_DEPLOY_PER_PASS"]


def schedule(state: JobsState, s: Schedule, now: int) -> Decision:
    """Deploy every ready execution whose inputs are available, each on a free slot of the
    TaskManager with the most free slots (see ``Schedule``)."""
    job_id, free, sessions, timers, clock = s.job_id, s.free, s.sessions, s.timers, s.clock
    job = state.jobs[job_id]
    rec = Recorder(state, job_id, now)
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
        if timers.held_back(job_id, ex, clock) if timers is not None else now < ex.not_before:
            later.append(ex)
            continue
        others = avoid(job, ex) if job.speculating else frozenset()
        tm = _pick(free, others)
        if tm is None and others and _pick(free) is not None:
            later.append(ex)  # a speculative attempt waits for a slot on another TaskManager
            continue
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


def _pick(free: FreeSlots, exclude: frozenset[str] = frozenset()) -> str | None:
    """The TaskManager with the most free slots (ties: the first by name), not one of
    ``exclude`` (those a speculative attempt's subtask runs on)."""
    best = min(((-len(slots), tm) for tm, slots in free.items() if slots and tm not in exclude), default=None)
    return best[1] if best else None


def _deploy(rec: Recorder, job: JobRun, ex: Execution, tm: str, slot: int, session: str | None = None) -> None:
    eid = ex.id
    rec.fact(
        UpdateTaskExecutionState(
            job.job_id, eid, TaskState.SCHEDULED, None, ex.vertex, ex.subtask, ex.attempt, tm, slot, session
        )
    )
    rec.fact(
        UpdateTaskExecutionState(
            job.job_id, eid, TaskState.DEPLOYING, None, ex.vertex, ex.subtask, ex.attempt, tm, slot
        )
    )
    rec.send(
        Address.taskmanager(tm),
        SubmitTask(job.job_id, eid, ex.vertex, ex.subtask, ex.attempt, slot, descriptor(job, ex)),
    )
