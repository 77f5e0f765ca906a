"""One way to drive a core in tests, as its shell does (dask's ``ws`` fixture).

``Driven`` holds a core's state and its door (``decide(state, stimulus, now) -> Decision``,
services/common/decision.py). ``tell`` decides one stimulus at ``now`` and ``record``s the
decision as the shell commits it: its facts (and each per-job part's) are appended to the
log with their time and folded into the state where the door does not fold them itself
(membership), its sends are routed to their inboxes; ``now`` is advanced by hand.

Every ``Driven`` made during a test is checked when the test ends (the autouse fixture
``cores_checked``, which tests/services/conftest.py provides): the log folded from scratch
must give the live state, and any invariant a test adds (``invariants``) must hold.
``JobsDriven`` drives the jobs core (one job, "j1", submitted at once), ``CoordinatorsDriven``
one job's coordinators as the JobManager's loop does.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from sluice.events import (
    Envelope,
    Event,
    JobGraph,
    JobVertex,
    ScheduleOrUpdateConsumers,
    SubmitJob,
    SubmitTask,
    TaskState,
    UpdateTaskExecutionState,
)
from sluice.services.common.decision import Address, Decision, Deliver, FailJob, Send
from sluice.services.coordination.runtime import JobCoordinators
from sluice.services.jobs import core, reconcile
from sluice.services.jobs.state import JobRun, JobsState, evolve
from tests.helpers import env

__all__ = ["Driven", "JobsDriven", "CoordinatorsDriven", "flushed", "cores_checked", "CFG"]

CFG = core.JobsConfig(slot_timeout_ms=10_000)

_made: list[Driven] | None = None


class Driven:
    """A core driven as its shell drives it. ``fold(state, envelope)`` applies one fact;
    ``fresh()`` makes an empty state (for the replay the teardown compares); ``folds``: the
    door does not apply its facts (the shell folds them once committed); ``normalize(state)``:
    what of a state a replay must give (None: all of it)."""

    def __init__(
        self,
        decide: Callable[[Any, Any, int], Decision],
        state: Any,
        *,
        fold: Callable[[Any, Envelope], Any] | None = None,
        fresh: Callable[[], Any] | None = None,
        folds: bool = False,
        normalize: Callable[[Any], Any] | None = None,
        now: int = 1_000,
    ) -> None:
        self.door, self.state, self.fold, self.fresh, self.folds = decide, state, fold, fresh, folds
        self.normalize = normalize
        self.now = now
        self.log: list[Event] = []
        self.timed: list[tuple[Event, int]] = []
        """The log's facts, each with the time it was committed at."""
        self.sent: list[Send] = []
        self.inboxes: dict[Address, list[Event]] = {}
        self.invariants: list[Callable[[], None]] = []
        if fold is not None and fresh is not None:
            self.invariants.append(self.check_replay)
        if _made is not None:
            _made.append(self)

    def tell(self, stimulus: Any) -> Decision:
        """Decide ``stimulus`` at ``now`` and commit what it decided."""
        return self.record(self.door(self.state, stimulus, self.now))

    def record(self, decision: Decision) -> Decision:
        """What the shell's commit does with a decision (and each per-job part of it)."""
        for part in (decision, *decision.jobs):
            self.log += part.facts
            self.timed += [(f, self.now) for f in part.facts]
            if self.folds and self.fold is not None:
                for f in part.facts:
                    self.fold(self.state, env(f))
            self.sent += part.sends
            for to, ev in part.sends:
                self.inboxes.setdefault(to, []).append(ev)
        return decision

    def commit(self, *facts: Event) -> None:
        """Facts the shell commits and folds itself (not decided by the door, or put in by hand)."""
        self.record(Decision(list(facts), now=self.now))
        if not self.folds and self.fold is not None:
            for f in facts:
                self.fold(self.state, Envelope(f, "", 0, self.now))

    def advance(self, ms: int) -> None:
        self.now += ms

    def replayed(self) -> Any:
        """The log folded into a fresh state."""
        assert self.fold is not None and self.fresh is not None
        state = self.fresh()
        for fact, at in self.timed:
            self.fold(state, Envelope(fact, "", 0, at))
        return state

    def normalized(self, state: Any) -> Any:
        """What of a state a replay must give (``normalize``'s view, else all of it)."""
        return state if self.normalize is None else self.normalize(state)

    def check_replay(self) -> None:
        assert self.normalized(copy.deepcopy(self.state)) == self.normalized(self.replayed()), (
            "the log folded from scratch differs from the live state"
        )

    def check(self) -> None:
        for invariant in self.invariants:
            invariant()


class JobsDriven(Driven):
    """The jobs core (and reconciliation, on the same state) driven as the JobManager shell
    does: job "j1" of ``graph`` submitted at once, TaskManagers with ``slots`` slots each
    (change ``slots`` to scale)."""

    def __init__(self, graph: JobGraph, slots: dict[str, int], *, now: int = 1_000) -> None:
        super().__init__(core.decide, JobsState(), fold=evolve, fresh=JobsState, now=now)
        self.reconcile_door: Callable[[JobsState, Any, int], Decision] = reconcile.decide
        self.slots = slots
        splits = {
            v.name: [{"path": "/data/in.txt", "start": i, "end": i + 1, "index": i} for i in range(3)]
            for v in graph.vertices
            if v.source is not None
        }
        self.tell(core.Submit(SubmitJob("j1", graph, "blob", "mod", "client-inbox"), splits, "file:///s"))

    def normalized(self, state: JobsState) -> JobsState:
        """But for ``ready``, the scheduler's work queue, which the live scheduler drains as it deploys."""
        for job in state.jobs.values():
            job.ready.clear()
        return state

    def replays_to_live(self) -> bool:
        return self.normalized(copy.deepcopy(self.state)) == self.normalized(self.replayed())

    def free(self) -> core.FreeSlots:
        used = self.state.pool.by_taskmanager
        return {tm: [s for s in range(n) if s not in used.get(tm, ())] for tm, n in sorted(self.slots.items())}

    def schedule(self, sessions: dict[str, str] | None = None) -> list[SubmitTask]:
        d = self.tell(core.Schedule("j1", self.free(), sessions))
        return [ev for _, ev in d.sends if isinstance(ev, SubmitTask)]

    def tell(self, stimulus: Any) -> Decision:
        """A stimulus of the jobs core; an event is a message in the job's inbox."""
        if isinstance(stimulus, Event):
            stimulus = core.Inbound("j1", env(stimulus), CFG)
        if isinstance(stimulus, (reconcile.SlotReport, reconcile.LostFinals, reconcile.DeploymentTimeouts)):
            return self.record(self.reconcile_door(self.state, stimulus, self.now))  # the leader's other door
        return super().tell(stimulus)

    def report(self, task: SubmitTask, state: TaskState, error: str | None = None) -> Decision:
        return self.tell(UpdateTaskExecutionState("j1", task.execution_id, state, error))

    def produce(self, task: SubmitTask) -> None:
        self.tell(ScheduleOrUpdateConsumers("j1", task.execution_id, task.vertex_id, task.subtask, task.attempt))

    def run_to_end(self, task: SubmitTask, produce: bool = True) -> None:
        self.report(task, TaskState.RUNNING)
        if produce and task.descriptor.output:
            self.produce(task)
        self.report(task, TaskState.FINISHED)

    @property
    def job(self) -> JobRun:
        return self.state.jobs["j1"]


class CoordinatorsDriven(Driven):
    """One job's coordinators as the JobManager's main loop drives them: each ``batch`` feeds
    its facts and appends them, then what the coordinators did (their flush), to the log."""

    def __init__(
        self,
        job_id: str,
        vertices: list[JobVertex],
        splits: dict[str, list],
        load: Callable[[str], type],
        *,
        now: int = 1000,
        **kwargs: Any,
    ) -> None:
        self.coords = JobCoordinators(job_id, vertices, splits, load, **kwargs)
        super().__init__(lambda coords, force, now: coords.flush(now, force=force), self.coords, now=now)
        self.job_id = job_id

    def batch(self, *facts: Event, step: int = 10, force: bool = False) -> Decision:
        for ev in facts:
            self.coords.feed(ev)
        self.record(Decision(list(facts), now=self.now))
        self.now += step
        flushed = self.tell(force)
        self.coords.committed()
        return flushed

    def envelopes(self) -> list[Envelope]:
        return [Envelope(ev, f"id{i}", 1, 1000 + i, self.job_id) for i, ev in enumerate(self.log)]


def flushed(decision: Decision) -> SimpleNamespace:
    """What the coordinators' flush decided, as ``facts`` (each fact with the (vertex, subtask)
    whose inbox it is also delivered to, None: none) and ``failures`` (the reasons)."""
    to = {d.fact: (d.to.vertex, d.to.subtask) for d in decision.of(Deliver)}
    return SimpleNamespace(
        facts=[(ev, to.get(i)) for i, ev in enumerate(decision.facts)],
        failures=[f.reason for f in decision.of(FailJob)],
    )


@pytest.fixture(autouse=True)
def cores_checked() -> Iterator[list[Driven]]:
    """Every core driven in the test: its invariants checked at the end (teardown)."""
    global _made
    outer, _made = _made, []
    made = _made
    try:
        yield made
    finally:
        _made = outer
    for driven in made:
        driven.check()
