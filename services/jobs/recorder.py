"""The jobs core's recorder: a decision being made, its facts applied to the state as they
are decided (a deployment takes a slot before the next one is chosen). If the commit then
fails, the shell throws the state away and rebuilds it from the log, so the state never
runs ahead of what was committed."""

from __future__ import annotations

from sluice.events import Envelope, Event, TaskState, UpdateTaskExecutionState
from sluice.services.common.decision import Address, Decision, Instruction, Note, Send
from sluice.services.kvstate import core as kvstate

from .state import Execution, JobsState, evolve

__all__ = ["Recorder"]


class Recorder:
    """Collects one job's facts and applies each to the state at once."""

    def __init__(self, state: JobsState, job_id: str, now: int) -> None:
        self.state, self.now = state, now
        self.decision = Decision(job_id=job_id, now=now)
        self.job_id = job_id

    def fact(self, ev: Event) -> None:
        self.decision.facts.append(ev)
        evolve(self.state, Envelope(ev, "", self.state.epoch, self.now))
        job = self.state.jobs.get(self.job_id)
        if job is not None and job.kvstate.locations:
            for follow in kvstate.released(job, ev):  # a failed attempt's queryable state goes with it
                self.fact(follow)

    def move(self, ex: Execution, state: TaskState, error: str | None = None) -> None:
        """The fact that attempt ``ex`` of this job moved to ``state`` (where it runs as the
        leader knows it)."""
        self.fact(
            UpdateTaskExecutionState(
                self.job_id, ex.id, state, error, ex.vertex, ex.subtask, ex.attempt, ex.taskmanager, ex.slot
            )
        )

    def send(self, to: Address, ev: Event) -> None:
        self.decision.sends.append(Send(to, ev))

    def note(self, text: str) -> None:
        self.decision.instructions.append(Note(text))

    def instruct(self, instruction: Instruction) -> None:
        self.decision.instructions.append(instruction)
