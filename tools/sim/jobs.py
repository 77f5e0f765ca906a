"""The jobs the simulation runs: small graphs drawn from the seed, and a user coordinator.

Every job reads a range source in splits, optionally sends the split ids through a keyed
exchange to a second vertex (which may have a user coordinator and publish queryable
state), and writes a sink. The data is the split ids themselves, so the invariants can
check end to end that each split was consumed exactly once.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Any, cast

from sluice.events import JobEdge, JobGraph, JobVertex, RestartStrategy, SinkSpec, SourceSpec
from sluice.services.coordination.coordinator import OperatorCoordinator

__all__ = ["CODE", "VIOLATIONS", "AsyncEchoCoordinator", "EchoCoordinator", "SimJob", "draw_job", "speculatable"]

CODE = b"# the simulation's jobs run no user code on Spark: tasks are simulated\n"

VIOLATIONS: list[str] = []
"""What the simulation's own coordinators saw that must never happen (cleared per seed)."""


@dataclass(frozen=True)
class SimJob:
    job_id: str
    graph: JobGraph
    splits: int
    keyed: bool
    coordinated: bool
    queryable: bool
    sink_path: str

    @property
    def source(self) -> str:
        return self.graph.vertices[0].name

    @property
    def last(self) -> str:
        return self.graph.vertices[-1].name


def draw_job(rng: random.Random, n: int) -> SimJob:
    job_id = f"job{n}"
    splits = rng.randint(1, 8)
    p1 = rng.randint(1, 3)
    protocol = rng.choice(("operator-events", "input-splits"))
    # The simulated readers ask after each split, so the end game plays when the source is
    # read each split: two jobs in three, drawn from what was drawn (another draw would shift
    # every later one, and a seed would no longer mean the run it meant before).
    each_split = (splits + p1) % 3 != 0
    source = JobVertex(
        "src", "source", p1, [], SourceSpec("range", [], 1, {"start": "0", "end": str(splits)}, protocol, each_split)
    )
    sink_path = f"sim://{job_id}/out"
    restart = RestartStrategy(
        rng.choice(("fixed-delay", "exponential-backoff")), rng.randint(3, 8), rng.choice((0, 50, 200)), 1000
    )
    keyed = rng.random() < 0.6
    if not keyed:
        source = JobVertex("src", "source", p1, [], source.source, SinkSpec("parquet", sink_path))
        return SimJob(job_id, JobGraph(job_id, [source], [], 8, restart), splits, False, False, False, sink_path)
    p2 = rng.randint(1, 3)
    coordinated = rng.random() < 0.5
    queryable = rng.random() < 0.5
    coordinator = None
    if coordinated:
        coordinator = "tools.sim.jobs:" + rng.choice(("EchoCoordinator", "AsyncEchoCoordinator"))
    agg = JobVertex(
        "agg",
        "transform",
        p2,
        ["sim:agg"],
        None,
        SinkSpec("parquet", sink_path),
        coordinator,
        "ids" if queryable else None,
    )
    graph = JobGraph(job_id, [source, agg], [JobEdge("src", "agg", "keyed", "id")], 8, restart)
    return SimJob(job_id, graph, splits, True, coordinated, queryable, sink_path)


def speculatable(job: SimJob) -> SimJob:
    """The job as the speculation scenario runs it: a keyed job's second vertex has no
    coordinator and no queryable state (speculation leaves such vertices alone) and three
    subtasks (a vertex's median needs a few finished ones). Draws nothing: the seed's draws
    stay what they were."""
    if not job.keyed:
        return job
    source, agg = job.graph.vertices
    agg = dataclasses.replace(agg, parallelism=3, coordinator=None, queryable=None)
    graph = dataclasses.replace(job.graph, vertices=[source, agg])
    return dataclasses.replace(job, graph=graph, coordinated=False, queryable=False)


class EchoCoordinator(OperatorCoordinator):
    """Answers each subtask's hello with a thanks naming it; deterministic: its answers
    go out in the commit of the hello (and are checked against the log on failover)."""

    deterministic = True

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self.seen: set[str] = set()
        self.answered = 0

    def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
        hello = cast(str, event.get("hello") if isinstance(event, dict) else None)  # the sim's tasks say a str
        if event.get("boom") if isinstance(event, dict) else False:
            raise RuntimeError(f"the coordinator of {self.context.operator_id} cannot take {event!r}")
        if hello in self.seen:
            VIOLATIONS.append(
                f"{self.context.job_id}/{self.context.operator_id}: hello {hello} handled twice by one coordinator"
            )
        self.seen.add(hello)
        self.answered += 1
        self.context.send_event(subtask, {"thanks": hello}, attempt)

    def checkpoint_coordinator(self, checkpoint_id: int) -> Any:
        return {"answered": self.answered, "seen": sorted(self.seen)}

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        self.answered = int(state["answered"])
        self.seen = set(state["seen"])


class AsyncEchoCoordinator(EchoCoordinator):
    """The same answers, worked out on the coordinator's own thread (not deterministic:
    its answers are held back until a checkpoint covers them). As the contract asks, its
    checkpoint holds the work still queued for its thread, which a restored coordinator
    queues again when it starts."""

    deterministic = False

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self.queued: dict[str, tuple[int, int]] = {}

    def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
        hello = cast(str, event.get("hello") if isinstance(event, dict) else None)  # the sim's tasks say a str
        if event.get("boom") if isinstance(event, dict) else False:
            raise RuntimeError(f"the coordinator of {self.context.operator_id} cannot take {event!r}")
        if hello in self.seen:
            VIOLATIONS.append(
                f"{self.context.job_id}/{self.context.operator_id}: hello {hello} handled twice by one coordinator"
            )
        self.seen.add(hello)
        self.queued[hello] = (subtask, attempt)
        self._work(hello)

    def _work(self, hello: str) -> None:
        def then(thanks: Any) -> None:
            target = self.queued.pop(hello, None)
            if target is not None:
                self.answered += 1
                self.context.send_event(target[0], thanks, target[1])

        self.context.call_async(lambda: {"thanks": hello}, then)

    def start(self) -> None:
        for hello in sorted(self.queued):
            self._work(hello)

    def subtask_reset(self, subtask: int, attempt: int) -> None:
        for hello, (s, _) in list(self.queued.items()):
            if s == subtask:
                del self.queued[hello]  # its new attempt says hello again

    def checkpoint_coordinator(self, checkpoint_id: int) -> Any:
        return {
            "answered": self.answered,
            "seen": sorted(self.seen),
            "queued": {h: list(t) for h, t in sorted(self.queued.items())},
        }

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        super().reset_to_checkpoint(checkpoint_id, state)
        self.queued = {h: (int(t[0]), int(t[1])) for h, t in state.get("queued", {}).items()}
