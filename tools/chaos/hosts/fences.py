"""The TaskManager side of fencing: a TaskManager declared lost may come back with reports
of the attempts it ran (its link was down, not its processes). None may be accepted: no
job fact may move an attempt of a lost registration after the loss, but to FAILED or
CANCELED (what the leader itself records). The JobManager side is ``checks.epochs_go_back``
and ``checks.refusal``."""

from __future__ import annotations

from dataclasses import dataclass

from sluice.events import TaskManagerLost, TaskManagerRegistered, TaskState, UpdateTaskExecutionState
from sluice.store import EventLog

from ..checks import job_ids

__all__ = ["Loss", "losses", "stale_reports", "TM_REFUSALS"]

TM_REFUSALS = ("declared lost", "registered afresh", "not registered with the leader")
"""What a TaskManager's log says when the leader no longer counts its old registration in
(services/membership/core.py's DisconnectTaskManager reason, services/taskmanager/process.py):
``checks.refusal(log, offset, TM_REFUSALS)`` finds it."""

_LEADER_WRITES = (TaskState.FAILED, TaskState.CANCELED, TaskState.CANCELING)


@dataclass(frozen=True)
class Loss:
    resource_id: str
    session: str
    at_ms: int
    """Server time of the TaskManagerLost fact."""
    back_ms: int | None
    """Server time of the next registration of the same TaskManager (None: it never came back)."""


def _ms(entry_id: str) -> int:
    return int(entry_id.split("-")[0])


def losses(log: EventLog) -> list[Loss]:
    """Every TaskManager declared lost, and when it registered again."""
    facts = list(log.replay(log.keys.facts(log.keys.cluster)))
    out = []
    for i, (entry_id, env) in enumerate(facts):
        if isinstance(env.event, TaskManagerLost):
            rid = env.event.resource_id
            back = next(
                (
                    _ms(e)
                    for e, later in facts[i + 1 :]
                    if isinstance(later.event, TaskManagerRegistered) and later.event.resource_id == rid
                ),
                None,
            )
            out.append(Loss(rid, env.event.session, _ms(entry_id), back))
    return out


def stale_reports(log: EventLog) -> list[str]:
    """Job facts that took a report of an attempt placed on a registration before its loss,
    after the loss (a TaskManager may register again under the same session: attempts placed
    after that belong to the new registration)."""
    lost: dict[tuple[str, str], list[int]] = {}
    for x in losses(log):
        lost.setdefault((x.resource_id, x.session), []).append(x.at_ms)
    problems = []
    for job_id in job_ids(log):
        placed: dict[str, tuple[str, str, int]] = {}
        for entry_id, env in log.replay(log.keys.facts(log.keys.job(job_id))):
            ev = env.event
            if not isinstance(ev, UpdateTaskExecutionState):
                continue
            if ev.state == TaskState.SCHEDULED and ev.session and ev.taskmanager:
                placed[ev.execution_id] = (ev.taskmanager, ev.session, _ms(entry_id))
            where = placed.get(ev.execution_id)
            if where is None or ev.state in _LEADER_WRITES:
                continue
            tm, session, since = where
            at = next((t for t in lost.get((tm, session), []) if since <= t < _ms(entry_id)), None)
            if at is not None:
                problems.append(
                    f"{ev.execution_id} moved to {ev.state.value} at {entry_id}, after its TaskManager "
                    f"{tm} (session {session}) was declared lost at {at}"
                )
    return problems
