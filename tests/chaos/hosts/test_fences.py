"""The TaskManager side of fencing, on a real Redis log: a report of an attempt placed on a
registration before its loss must not be taken after the loss; attempts placed on the same
TaskManager once it registered again (under the same session) are its new work."""

from __future__ import annotations

import time

from sluice.events import JobRegistered, TaskManagerLost, TaskManagerRegistered, TaskState, UpdateTaskExecutionState
from sluice.store import EventLog
from tools.chaos.hosts.fences import losses, stale_reports

from ...helpers import env


def _update(execution: str, state: TaskState, session: str | None = None) -> UpdateTaskExecutionState:
    return UpdateTaskExecutionState("j1", execution, state, None, "words", 0, int(execution[-1]), "tm1", 0, session)


def test_a_lost_registrations_late_report_is_named_and_its_next_registrations_work_is_not(log: EventLog) -> None:
    cluster, job = log.keys.facts(log.keys.cluster), log.keys.facts(log.keys.job("j1"))

    def write(stream: str, event) -> None:
        log.append(stream, env(event))
        time.sleep(0.005)  # entries a millisecond apart at least: their ids order them in time

    write(cluster, JobRegistered("j1", "chaos"))
    write(cluster, TaskManagerRegistered("tm1", "s1", "host-a", 2))
    write(job, _update("words:0:0", TaskState.SCHEDULED, "s1"))
    write(job, _update("words:0:0", TaskState.RUNNING))
    write(cluster, TaskManagerLost("tm1", "s1", "no heartbeat"))
    write(job, _update("words:0:0", TaskState.FAILED))  # the leader's own record of the loss
    write(job, _update("words:0:0", TaskState.FINISHED))  # the lost TaskManager's late report, taken
    write(cluster, TaskManagerRegistered("tm1", "s1", "host-a", 2))  # back, same session
    write(job, _update("words:0:1", TaskState.SCHEDULED, "s1"))
    write(job, _update("words:0:1", TaskState.RUNNING))
    write(job, _update("words:0:1", TaskState.FINISHED))

    [loss] = losses(log)
    assert loss.resource_id == "tm1" and loss.back_ms is not None and loss.back_ms > loss.at_ms
    problems = stale_reports(log)
    assert len(problems) == 1, problems
    assert problems[0].startswith("words:0:0 moved to FINISHED") and "tm1 (session s1) was declared lost" in problems[0]
