"""Scheduling, pure: a job's ready executions deployed onto free slots, a TaskManager's
at a time (the one with the most free slots, so a vertex spreads over TaskManagers).

**Order.** When more executions are ready than slots are free, the ones taken first are
those on the shortest way to the job's end: executions of vertices that already have inputs
(a later stage: what the job waits on) before sources, and among sources, those that feed
the same downstream vertex together (it starts only once all of them are done), the
group with the least input first, and in a group the smaller source first (it is done
soon, its slot goes to the next). A source's input is the bytes (or numbers) of its split
plan. Only the first ``ORDER_WINDOW`` queued executions are ordered (a pass stays O(1)
in the queue's length); among equals, the queue's order (first in, first out) holds."""

from __future__ import annotations

from typing import Any

from sluice.events import JobSlotsFound, JobWaitingForSlots, SubmitTask, TaskState, UpdateTaskExecutionState
from sluice.services.common.decision import Address, Decision

from .descriptor import descriptor
from .machine import LIVE_JOB
from .recorder import Recorder
from .speculation import avoid
from .state import Execution, JobRun, JobsState
from .stimuli import FreeSlots, Schedule

__all__ = ["schedule", "MAX_DEPLOY_PER_PASS", "ORDER_WINDOW", "source_input"]

ORDER_WINDOW = 256
"""How many of the queued executions each pass orders (see the module doc)."""


def schedule(state: JobsState, s: Schedule, now: int) -> Decision:
    """Deploy every ready execution whose inputs are available, each on a free slot of the
    TaskManager with the most free slots (see ``Schedule``)."""
    job_id, free, sessions, timers, clock = s.job_id, s.free, s.sessions, s.timers, s.clock
    job = state.jobs[job_id]
    rec = Recorder(state, job_id, now)
    if job.status not in LIVE_JOB or not job.built:
        return rec.decision
    ready = job.ready
    _order(job, sum(len(slots) for slots in free.values()))
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


def source_input(splits: list[Any]) -> int:
    """What a source reads, from its split plan: bytes of its byte ranges, numbers of its
    ranges, and for a split that says neither (Parquet row groups) 1 MiB a row group."""
    total = 0
    for split in splits:
        if isinstance(split, dict):
            if isinstance(split.get("start"), int) and isinstance(split.get("end"), int):
                total += max(0, split["end"] - split["start"])
                continue
            groups = split.get("row_groups")
            if isinstance(groups, list) and len(groups) == 2 and all(isinstance(g, int) for g in groups):
                total += max(1, groups[1] - groups[0]) << 20
                continue
        total += 1 << 20
    return total


_INPUTS: dict[tuple[str, str, int], int] = {}
"""``source_input`` of a job's source, by (job, vertex, splits): a plan never changes once
submitted, so this is a pure function's memo (bounded: cleared when it grows large)."""


def _input_of(job: JobRun, vertex: str) -> int:
    splits = job.splits.get(vertex) or []
    key = (job.job_id, vertex, len(splits))
    if (found := _INPUTS.get(key)) is None:
        if len(_INPUTS) > 4096:
            _INPUTS.clear()
        found = _INPUTS[key] = source_input(splits)
    return found


def _order(job: JobRun, free: int) -> None:
    """Order the head of the job's queue (see the module doc), when not everything fits."""
    ready = job.ready
    if len(ready) <= free or free == 0:
        return  # all of it is deployed now (or nothing is): the order changes nothing
    head = [ready.popleft() for _ in range(min(len(ready), ORDER_WINDOW))]
    sizes: dict[str, int] = {}
    groups: dict[str, tuple[str, ...]] = {}
    for ex in head:
        v = job.vertices[ex.vertex]
        if not v.inputs and ex.vertex not in sizes:
            sizes[ex.vertex] = _input_of(job, ex.vertex)
            groups[ex.vertex] = tuple(sorted({e.target for e in v.outputs}))
    if sizes:
        group_size: dict[tuple[str, ...], int] = {}
        for group in groups.values():  # every source feeding the group, not only those queued
            if group not in group_size:
                group_size[group] = sum(
                    _input_of(job, u.spec.name)
                    for u in job.vertices.values()
                    if not u.inputs and tuple(sorted({e.target for e in u.outputs})) == group
                )

        def key(ex: Execution) -> tuple[int, int, tuple[str, ...], int, str]:
            if ex.vertex not in sizes:
                return (0, 0, (), 0, "")  # a later stage first, in its queue order
            group = groups[ex.vertex]
            return (1, group_size[group], group, sizes[ex.vertex], ex.vertex)

        head.sort(key=key)  # stable: within a vertex, the queue's order
    ready.extendleft(reversed(head))


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
