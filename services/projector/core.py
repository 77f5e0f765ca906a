"""Projections: how a fact stream becomes a table, using the components' own ``evolve``.

A projection names its table, the fact stream it reads, how to start (``initial``),
how to apply an event (the component's ``evolve``), which rows an event touches, how
to render a row, and how to rebuild the state from the stored rows (so a restarted
projector carries on from its table and position instead of replaying everything).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sluice.events import (
    AttemptWon,
    Envelope,
    ExecutionGraphBuilt,
    JobDisposed,
    JobPurged,
    JobRegistered,
    LeadershipGranted,
    NotifyKvStateRegistered,
    NotifyKvStateUnregistered,
    ScheduleOrUpdateConsumers,
    SpeculativeAttemptScheduled,
    TaskRestartScheduled,
    UpdateTaskExecutionState,
)
from sluice.services.jobs.state import JobsState
from sluice.services.jobs.state import evolve as jobs_evolve
from sluice.services.kvstate import registry as kvreg
from sluice.services.membership.core import Membership, TaskManagerRow
from sluice.services.membership.core import evolve as membership_evolve

__all__ = [
    "Projection",
    "PROJECTIONS",
    "TASKMANAGERS",
    "LEADERSHIP",
    "JOBS",
    "EXECUTION_GRAPH",
    "KVSTATE",
    "JOB_PROJECTIONS",
]


@dataclass(frozen=True)
class Projection:
    name: str
    initial: Callable[[], Any]
    evolve: Callable[[Any, Envelope], Any]
    touched: Callable[[Envelope], tuple[str, ...]]
    row: Callable[[Any, str], dict[str, Any] | None]
    load: Callable[[dict[str, dict[str, Any]]], Any] | None
    """Rebuilds the state from the stored rows; None: replay the stream up to the stored position."""


def _tm_touched(env: Envelope) -> tuple[str, ...]:
    rid = getattr(env.event, "resource_id", None)
    return (rid,) if rid is not None else ()


def _tm_row(state: Membership, key: str) -> dict[str, Any] | None:
    row = state.taskmanagers.get(key)
    return row.to_dict() if row else None


def _tm_load(rows: dict[str, dict[str, Any]]) -> Membership:
    return Membership(taskmanagers={k: TaskManagerRow.from_dict(v) for k, v in rows.items()})


TASKMANAGERS = Projection(
    name="taskmanagers",
    initial=Membership,
    evolve=membership_evolve,
    touched=_tm_touched,
    row=_tm_row,
    load=_tm_load,
)


def _leader_evolve(state: Membership, env: Envelope) -> Membership:
    return membership_evolve(state, env) if isinstance(env.event, LeadershipGranted) else state


LEADERSHIP = Projection(
    name="leadership",
    initial=Membership,
    evolve=_leader_evolve,
    touched=lambda env: ("leader",) if isinstance(env.event, LeadershipGranted) else (),
    row=lambda state, key: {"epoch": state.epoch, "leader_id": state.leader_id} if state.leader_id else None,
    load=lambda rows: Membership(
        epoch=rows.get("leader", {}).get("epoch", 0), leader_id=rows.get("leader", {}).get("leader_id")
    ),
)


def _jobs_evolve(state: dict[str, dict[str, Any]], env: Envelope) -> dict[str, dict[str, Any]]:
    ev = env.event
    if isinstance(ev, JobRegistered):
        state[ev.job_id] = {"job_id": ev.job_id, "name": ev.name, "registered_at": env.ts}
    elif isinstance(ev, JobPurged):  # its row stays, saying so
        state[ev.job_id] = {
            **state.get(ev.job_id, {"job_id": ev.job_id, "name": ev.name}),
            "purged_at": ev.purged_at,
            "status": ev.status.value,
        }
    return state


JOBS = Projection(
    name="jobs",
    initial=dict,
    evolve=_jobs_evolve,
    touched=lambda env: (env.event.job_id,) if isinstance(env.event, (JobRegistered, JobPurged)) else (),
    row=lambda state, key: state.get(key),
    load=lambda rows: dict(rows),
)

PROJECTIONS: tuple[Projection, ...] = (TASKMANAGERS, LEADERSHIP, JOBS)


# --- one job's ExecutionGraph ---------------------------------------------------------------


def _eg_touched(env: Envelope) -> tuple[str, ...]:
    ev = env.event
    if isinstance(
        ev,
        (
            UpdateTaskExecutionState,
            TaskRestartScheduled,
            ScheduleOrUpdateConsumers,
            SpeculativeAttemptScheduled,
            AttemptWon,
        ),
    ):
        return ("job", f"{ev.vertex_id}/{ev.subtask}")
    if isinstance(ev, ExecutionGraphBuilt):
        return ("job", "*")
    return ("job",)


def _eg_row(state: JobsState, key: str) -> dict[str, Any] | None:
    if not state.jobs:
        return None
    (job,) = state.jobs.values()
    if key == "job":
        return {
            "job_id": job.job_id,
            "name": job.name,
            "status": job.status.value,
            "reason": job.reason,
            "submitted_at": job.submitted_at,
            "ended_at": job.ended_at,
            "restarts": job.restarts,
            "waiting_since": job.waiting_since,
            "vertices": [
                {
                    "name": n,
                    "parallelism": len(v.subtasks),
                    "states": dict(Counter(ex.state.value for ex in v.subtasks)),
                }
                for n, v in job.vertices.items()
            ],
            "outputs": [v.spec.sink.path for v in job.vertices.values() if v.spec.sink is not None],
        }
    vertex, _, sub = key.rpartition("/")
    v = job.vertices.get(vertex)
    if v is None:
        return None
    ex = v.subtasks[int(sub)]
    row = {
        "vertex": vertex,
        "subtask": ex.subtask,
        "attempt": ex.attempt,
        "state": ex.state.value,
        "taskmanager": ex.taskmanager,
        "slot": ex.slot,
        "since": ex.since,
        "error": ex.error,
    }
    beside = v.concurrent.get(ex.subtask) if v.concurrent else None
    if beside:  # speculative execution: the attempts that run beside the current one
        row["beside"] = [
            {"attempt": o.attempt, "state": o.state.value, "taskmanager": o.taskmanager, "slot": o.slot} for o in beside
        ]
    return row


def expand(state: JobsState, keys: set[str]) -> set[str]:
    """``*`` (the whole graph was built) stands for every subtask row."""
    if "*" not in keys:
        return keys
    keys = set(keys) - {"*"}
    for job in state.jobs.values():
        for name, v in job.vertices.items():
            keys.update(f"{name}/{i}" for i in range(len(v.subtasks)))
    return keys


EXECUTION_GRAPH = Projection(
    name="executiongraph",
    initial=JobsState,
    evolve=jobs_evolve,
    touched=_eg_touched,
    row=_eg_row,
    load=None,
)


# --- one job's KvStateLocation table (queryable state) ------------------------------------------


def _kv_touched(env: Envelope) -> tuple[str, ...]:
    ev = env.event
    if isinstance(ev, (NotifyKvStateRegistered, NotifyKvStateUnregistered)):
        return (ev.registration_name,)
    if isinstance(ev, JobDisposed):
        return tuple(ev.names)
    return ()


def _kv_row(state: kvreg.KvStateRegistry, name: str) -> dict[str, Any] | None:
    loc = state.locations.get(name)
    return kvreg.location_row(loc) if loc is not None else None


KVSTATE = Projection(
    name="kvstate",
    initial=kvreg.KvStateRegistry,
    evolve=lambda state, env: kvreg.evolve(state, env.event),
    touched=_kv_touched,
    row=_kv_row,
    load=None,
)
"""Registration name -> KvStateLocation (vertex, key groups, ranges -> state id and address),
folded with the registry's own ``evolve``."""

JOB_PROJECTIONS: tuple[Projection, ...] = (EXECUTION_GRAPH, KVSTATE)
"""The tables every registered job gets."""
