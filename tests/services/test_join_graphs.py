"""Joins and broadcast inputs in the graph (issue 32), pure: what the API builds, what
validation refuses (naming the vertices and the fix), and what each subtask is told to read."""

from __future__ import annotations

import pytest

from sluice.api import Job, Keyed, Stream
from sluice.events import (
    DEFAULT_BROADCAST_LIMIT_BYTES,
    JobEdge,
    JobGraph,
    JobVertex,
    SinkSpec,
    SourceSpec,
    SubmitJob,
    TaskDeploymentDescriptor,
    descriptor_from_json,
    descriptor_to_json,
)
from sluice.services.dataplane.keygroups import key_group_range
from sluice.services.jobs import core
from sluice.services.jobs.core import descriptor
from sluice.services.jobs.state import JobRun, JobsState
from sluice.services.jobs.validate import broadcast_size_problems, broadcast_sizes_known, problems


def pair(a, b):
    return a


def one(a):
    return a


def two_sources(j: Job, pa: int = 2, pb: int = 2) -> tuple[Stream, Stream]:
    return j.read_parquet("a", "/in/a", parallelism=pa), j.read_parquet("b", "/in/b", parallelism=pb)


def test_a_join_reads_both_sides_keyed_in_the_order_given() -> None:
    j = Job("j")
    a, b = two_sources(j)
    a.key_by("k").join(b.key_by("tailnum"), "join", pair, parallelism=3).write_parquet("out", "/out")
    g = j.graph()
    assert [(e.source, e.exchange, e.key) for e in g.edges if e.target == "join -> out"] == [
        ("a", "keyed", "k"),
        ("b", "keyed", "tailnum"),
    ]
    assert next(v for v in g.vertices if v.name == "join -> out").parallelism == 3
    assert problems(g) == []


def test_map_over_several_keyed_inputs_and_a_broadcast() -> None:
    j = Job("j")
    a, b = two_sources(j)
    c = j.read_parquet("c", "/in/c", parallelism=1)
    a.key_by("k").map("three", pair, also=[b.key_by("k"), c.broadcast()]).write_parquet("out", "/out")
    g = j.graph()
    assert [(e.source, e.exchange) for e in g.edges] == [("a", "keyed"), ("b", "keyed"), ("c", "broadcast")]
    assert problems(g) == []


def test_a_transform_refuses_what_is_not_an_input() -> None:
    j = Job("j")
    a, _ = two_sources(j)
    with pytest.raises(TypeError, match=r"use a Stream, stream.key_by\(col\) or stream.broadcast\(\)"):
        a.map("m", pair, also=["b"])  # type: ignore[list-item]


def test_keyed_inputs_of_different_max_parallelism_are_refused_naming_both() -> None:
    j = Job("j")
    a, b = two_sources(j)
    a.key_by("k", max_parallelism=64).join(b.key_by("k"), "join", pair).write_parquet("out", "/out")
    (found,) = problems(j.graph())
    assert "vertex 'join -> out' reads keyed inputs hashed into different numbers of key groups" in found
    assert "'a' (key 'k', max_parallelism 64) and 'b' (key 'k', max_parallelism 128)" in found
    assert "key_by(col, max_parallelism=N)" in found
    # The same number of key groups on both sides is fine, the job's or another.
    j = Job("j")
    a, b = two_sources(j)
    a.key_by("k", max_parallelism=64).join(b.key_by("k", max_parallelism=64), "join", pair).write_parquet("o", "/o")
    assert problems(j.graph()) == []


def test_a_forward_edge_into_a_keyed_vertex_must_come_partitioned_as_its_keyed_inputs() -> None:
    # The held-out job's shape: one side aggregated in a keyed vertex, then forward into the join.
    def graph(p_agg: int, p_join: int, groups: int | None = None) -> JobGraph:
        j = Job("j", chaining=False)
        a, b = two_sources(j)
        agg = a.key_by("k", max_parallelism=groups).map("agg", one, parallelism=p_agg)
        agg.map("join", pair, parallelism=p_join, also=[b.key_by("k")]).write_parquet("out", "/out")
        return j.graph()

    assert problems(graph(3, 3)) == []  # same parallelism, same key groups: co-partitioned
    mis = [p for p in problems(graph(2, 3)) if "mis-partition" in p]
    assert mis == [
        "forward edge 'agg' -> 'join' would mis-partition: 'join' reads 'b' keyed by 'k' (partitioned into 128 key "
        "groups over 3 subtasks), but 'agg' is partitioned into 128 key groups over 2 subtasks, so subtask i of "
        "'agg' does not hold the keys of subtask i of 'join'; key it instead ('agg' as stream.key_by(col) in the "
        "join: a.key_by(k).join(b.key_by(k), ...)), or broadcast it (stream.broadcast()) if it is small"
    ]
    assert [p for p in problems(graph(3, 3, groups=64)) if "mis-partition" in p and "64 key groups" in p]


def test_a_forward_edge_from_an_unkeyed_vertex_into_a_keyed_one_is_refused() -> None:
    j = Job("j", chaining=False)
    a, b = two_sources(j)
    a.map("m", one).map("join", pair, also=[b.key_by("k")]).write_parquet("out", "/out")
    (found,) = problems(j.graph())
    assert "forward edge 'm' -> 'join' would mis-partition" in found and "'m' is not partitioned by key" in found


def test_a_forward_edge_through_unkeyed_maps_after_a_keyed_vertex_keeps_its_partitioning() -> None:
    j = Job("j", chaining=False)
    a, b = two_sources(j)
    after = a.key_by("k").map("agg", one).map("tidy", one)
    after.map("join", pair, also=[b.key_by("k")]).write_parquet("out", "/out")
    assert problems(j.graph()) == []


def test_a_producer_may_feed_a_keyed_consumer_and_a_broadcast_one() -> None:
    j = Job("j")
    a, b = two_sources(j)
    b.key_by("k").map("per key", one).write_parquet("o1", "/o1")
    a.map("enrich", pair, also=[b.broadcast()]).write_parquet("o2", "/o2")
    assert problems(j.graph()) == []


def test_queryable_state_needs_the_jobs_key_groups() -> None:
    j = Job("j")
    a = j.read_parquet("a", "/in/a")
    a.key_by("k", max_parallelism=64).map("agg", one, queryable="q").write_parquet("out", "/out")
    (found,) = problems(j.graph())
    assert "queryable state 'q'" in found and "keyed into 64 key groups, not the job's 128" in found


def test_bad_exchanges_and_limits_are_named() -> None:
    g = JobGraph(
        "j",
        [JobVertex("a", "source", 1, source=SourceSpec("parquet", ["/a"], 1)), JobVertex("m", "transform", 1, ["x:y"])],
        [JobEdge("a", "m", "shuffle"), JobEdge("a", "m", "keyed", "k", 0)],
        broadcast_limit_bytes=0,
    )
    found = problems(g)
    assert any("has exchange 'shuffle'; use 'forward', 'keyed', 'broadcast'" in p for p in found)
    assert any("max_parallelism 0 key groups; it must be an int between 1 and 32768" in p for p in found)
    assert any("broadcast limit 0 must be a positive number of bytes" in p for p in found)


def test_a_broadcast_of_a_parquet_source_read_whole_is_sized_at_submission() -> None:
    j = Job("j", broadcast_limit_bytes=1000)
    a, b = two_sources(j)
    c = j.read_csv("c", "/in/c", parallelism=1)
    a.map("enrich", pair, also=[b.broadcast(), c.broadcast()]).write_parquet("out", "/out")
    g = j.graph()
    assert [v.name for v in broadcast_sizes_known(g)] == ["b"]  # a CSV's Parquet size is not its own
    assert broadcast_size_problems(g, {"b": 999}) == []
    (found,) = broadcast_size_problems(g, {"b": 5 * 1024 * 1024})
    assert found.startswith(
        "broadcast input 'b' of vertex 'enrich -> out' is 5.0 MiB (5242880 bytes), above the broadcast limit of "
        "1000 bytes: every subtask of 'enrich -> out' would read it whole"
    )
    assert "(a.key_by(k).join(b.key_by(k), ...))" in found and "Job(..., broadcast_limit_bytes=N)" in found
    assert Job("d").graph().broadcast_limit_bytes == DEFAULT_BROADCAST_LIMIT_BYTES == 64 * 1024 * 1024


def _run(j: Job) -> JobRun:
    state = JobsState()
    g = j.graph()
    splits = {v.name: [{"path": "/in", "start": 0, "length": 2}] for v in g.vertices if v.source}
    core.decide(state, core.Submit(SubmitJob("job-1", g, "blob", "mod", "reply", {}), splits, "file:///s", 3), 0)
    return state.jobs["job-1"]


def test_each_subtask_of_a_join_reads_the_same_key_groups_of_both_sides_and_a_broadcast_whole() -> None:
    j = Job("j", broadcast_limit_bytes=12345)
    a, b = two_sources(j, 3, 2)
    c = j.read_parquet("c", "/in/c", parallelism=2)
    a.key_by("k", max_parallelism=64).join(b.key_by("t", max_parallelism=64), "join", pair, parallelism=4).map(
        "with c", pair, also=[c.broadcast()]
    ).write_parquet("out", "/out")
    run = _run(j)
    for ex in run.vertices["join"].subtasks:
        d = descriptor(run, ex)
        first, second = d.inputs
        assert first.key_groups == second.key_groups == list(key_group_range(64, 4, ex.subtask))
        assert (first.vertex, first.key, second.vertex, second.key) == ("a", "k", "b", "t")
        assert d.max_parallelism == 64
    for name in ("a", "b"):  # both sides hash into the join's 64 key groups, one directory per join subtask
        out = descriptor(run, run.vertices[name].subtasks[0]).output
        assert out is not None and (out.key, out.max_parallelism, out.consumers) in {("k", 64, 4), ("t", 64, 4)}
    d = descriptor(run, run.vertices["with c -> out"].subtasks[1])
    forward, broadcast = d.inputs
    assert forward.paths is not None and forward.broadcast_limit is None
    assert broadcast.key_groups is None and broadcast.broadcast_limit == 12345 and broadcast.vertex == "c"
    assert len(broadcast.partition_paths()) == 2  # every partition of c
    assert descriptor_from_json(descriptor_to_json(d)) == d


def test_keyed_consumers_of_different_parallelism_get_one_directory_per_key_group() -> None:
    j = Job("j")
    a, _ = two_sources(j)
    keyed: Keyed = a.key_by("k")
    keyed.map("two", one, parallelism=2).write_parquet("o2", "/o2")
    keyed.map("three", one, parallelism=3).write_parquet("o3", "/o3")
    run = _run(j)
    out = descriptor(run, run.vertices["a"].subtasks[0]).output
    assert out is not None and out.key == "k" and out.consumers == 0  # exact key groups: right for both


def test_a_version_2_descriptor_reads_as_the_current_version() -> None:
    d = TaskDeploymentDescriptor("j", "v:0:0", "v", 0, 0, 1, 128, "noop", "0" * 64, "m", [], {}, [])
    v2 = {**descriptor_to_json(d), "version": 2}
    assert descriptor_from_json(v2) == d and d.version == 4


def test_a_transform_of_broadcast_inputs_alone_is_refused_unless_it_has_one_subtask() -> None:
    def graph(parallelism: int) -> JobGraph:
        source = JobVertex("a", "source", 2, source=SourceSpec("parquet", ["/a"], 1))
        m = JobVertex("m", "transform", parallelism, ["x:y"], sink=SinkSpec("parquet", "/o"))
        return JobGraph("j", [source, m], [JobEdge("a", "m", "broadcast")])

    (found,) = problems(graph(3))
    assert found.startswith("transform 'm' reads only broadcast inputs, so each of its 3 subtasks would compute")
    assert problems(graph(1)) == []
