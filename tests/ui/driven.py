"""A job the dashboard's tests drive step by step on the session's real Redis: a real
JobManager and TaskManager (their step functions, a clock the test moves), workers that are
the test itself. The job reads numbers in one source vertex of two subtasks; subtask 0's
first attempt fails with a user's traceback and is restarted, so the log holds a failure, a
restart and three attempts by the end."""

from __future__ import annotations

from pathlib import Path

from sluice.events import TaskState
from sluice.events.descriptor import descriptor_from_json
from sluice.services.jobs.state import JobRun
from sluice.services.taskmanager.worker import report_state
from sluice.store import EventLog
from tests.services.failover_helpers import (
    ManualWorld,
    TinySlots,
    jm,
    job_state,
    lead,
    pump,
    register_tm,
    report,
    source_graph,
    submit,
    tm,
)

__all__ = ["DrivenJob", "TRACEBACK"]

TRACEBACK = (
    'Traceback (most recent call last):\n  File "job.py", line 7, in tokenize\n'
    '    raise ValueError(f"cannot split line {n}")\nValueError: cannot split line 17\n'
)


class DrivenJob:
    def __init__(self, log: EventLog, tmp_path: Path, job_id: str = "j1") -> None:
        self.log, self.job_id = log, job_id
        self.world = ManualWorld()
        self.jm = jm(log, self.world, "jm-a", tmp_path)
        lead(self.jm, self.world)
        self.slots = TinySlots()
        self.tm = tm(log, self.world, tmp_path, self.slots, n=2)
        register_tm(self.jm, self.tm, self.world)
        self.reported: set[str] = set()  # handles of the launches reported RUNNING

    def job(self) -> JobRun:
        return job_state(self.log, self.job_id)

    def _pump(self, until, what: str) -> None:
        pump([self.jm.step, self.tm.step], until, what=what, world=self.world, advance_ms=10)

    def _states(self) -> list[str]:
        return sorted(ex.state.value for ex in self.job().executions())

    def submit(self) -> None:
        """Submit the job and step until both subtasks were handed to the slots."""
        submit(self.log, self.world, self.job_id, source_graph(self.job_id, parallelism=2))
        self._pump(lambda: len(self.slots.launched) == 2, "two launches")

    def run(self) -> None:
        """Report every launched task RUNNING; step until the job's log says so."""
        for slot, d, handle in self.slots.launched:
            if handle not in self.reported:
                self.reported.add(handle)
                report(self.log, self.world, d, "tm-1", slot, TaskState.RUNNING)
        self._pump(lambda: self._states() == ["RUNNING", "RUNNING"], "both subtasks RUNNING")

    def fail_first(self) -> None:
        """Subtask 0's first attempt fails with the user's traceback; step until its restart
        was handed to a slot."""
        slot, d, _ = self.slots.launched[0]
        report_state(self.log, self.world, descriptor_from_json(d), "tm-1", slot, TaskState.FAILED, error=TRACEBACK)
        self._pump(lambda: len(self.slots.launched) == 3, "the restarted attempt's launch")

    def finish(self) -> None:
        """Every current task runs and finishes; step until the job has ended."""
        self.run()
        for slot, d, _ in self.slots.launched[1:]:
            report(self.log, self.world, d, "tm-1", slot, TaskState.FINISHED)
        self._pump(lambda: self.job().ended_at is not None, "the job's end")

    def all_the_way(self) -> None:
        self.submit()
        self.run()
        self.fail_first()
        self.finish()
