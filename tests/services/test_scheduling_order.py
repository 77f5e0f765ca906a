"""The order slots are filled in (issue 31): a later stage before sources; sources feeding
the same downstream vertex together, the smaller input first. Pure: the jobs core alone."""

from __future__ import annotations

from sluice.events import JobEdge, JobGraph, JobVertex, RestartStrategy, SinkSpec, SourceSpec, SubmitJob, TaskState
from sluice.services.jobs import core
from sluice.services.jobs.scheduling import source_input
from sluice.services.jobs.state import JobsState
from sluice.services.jobs.validate import validate
from tests.services import jobfixtures

FN = "tests.services.jobfixtures:identity"


def _splits(n: int, size: int) -> list[dict[str, object]]:
    return [{"format": "csv", "path": "/x", "start": i * size, "end": (i + 1) * size, "index": i} for i in range(n)]


def _deployed(decision: core.Decision) -> list[str]:
    return [
        ev.execution_id
        for ev in decision.facts
        if isinstance(ev, core.UpdateTaskExecutionState) and ev.state == TaskState.SCHEDULED
    ]


def test_the_smaller_source_of_a_join_goes_first_then_the_rest_in_queue_order() -> None:
    """A join of a big source (4 readers) and a small one (2), on 2 slots: the small one's
    readers are deployed first, as issue 31's Gantt wanted; the big one's after, in order."""
    big = JobVertex("big", "source", 4, source=SourceSpec("csv", ["/big"], 0))
    small = JobVertex("small", "source", 2, source=SourceSpec("csv", ["/small"], 0))
    join = JobVertex("join", "transform", 2, [FN], sink=SinkSpec("parquet", "/out"))
    edges = [JobEdge("big", "join", "keyed", "k"), JobEdge("small", "join", "keyed", "k")]
    graph = JobGraph("g", [big, small, join], edges, 128, RestartStrategy("none"))
    validate(graph, jobfixtures)
    state = JobsState()
    plan = {"big": _splits(4, 8 << 20), "small": _splits(1, 1 << 20)}
    core.decide(state, core.Submit(SubmitJob("j1", graph, "blob", "mod", "c"), plan, "file:///s"), 1_000)
    first = _deployed(core.decide(state, core.Schedule("j1", {"tm-a": [0, 1]}, {"tm-a": "s"}), 1_000))
    assert first == ["small:0:0", "small:1:0"]
    job = state.jobs["j1"]
    assert [ex.id for ex in job.ready] == ["big:0:0", "big:1:0", "big:2:0", "big:3:0"]
    everything = _deployed(core.decide(state, core.Schedule("j1", {"tm-b": [0, 1, 2, 3]}, {"tm-b": "s"}), 1_000))
    assert everything == ["big:0:0", "big:1:0", "big:2:0", "big:3:0"]  # all fit: queue order


def test_source_input_counts_bytes_numbers_and_row_groups() -> None:
    assert source_input(_splits(3, 10)) == 30
    assert source_input([{"format": "range", "start": 5, "end": 15}]) == 10
    assert source_input([{"format": "parquet", "path": "/p", "row_groups": [0, 2]}]) == 2 << 20
    assert source_input([]) == 0
