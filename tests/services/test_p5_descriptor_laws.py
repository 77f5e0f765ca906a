"""Deployment descriptors are built with less work per subtask (the partition folder of a
vertex is remembered, loops instead of generators): the same descriptors as before, for
every subtask of graphs of every exchange kind and for any vertex name."""

from __future__ import annotations

import hashlib
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.api import Job
from sluice.events import (
    ProducerPartitions,
    SubmitJob,
    TaskDeploymentDescriptor,
    TaskInput,
    TaskOutput,
    TaskQueryable,
    TaskSink,
    TaskSource,
)
from sluice.services.jobs import core
from sluice.services.jobs.core import descriptor, partition_path
from sluice.services.jobs.state import JobRun, JobsState


def _old_partition_path(storage_root: str, job_id: str, vertex: str, subtask: int, attempt: int) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", vertex).strip("_") or "vertex"
    digest = hashlib.sha1(vertex.encode()).hexdigest()[:6]
    return f"{storage_root.rstrip('/')}/{job_id}/{safe}-{digest}/{subtask}/{attempt}"


def _old_descriptor(job: JobRun, ex) -> TaskDeploymentDescriptor:  # the code before, as the reference
    from sluice.services.dataplane.keygroups import key_group_range

    vertex = job.vertices[ex.vertex]
    spec = vertex.spec
    maxp = job.graph.max_parallelism
    inputs = []
    for edge in vertex.inputs:
        producer = job.vertices[edge.source]
        if edge.exchange == "forward":
            p = producer.subtasks[ex.subtask]
            inputs.append(
                TaskInput(
                    paths=[_old_partition_path(job.storage_root, job.job_id, edge.source, p.subtask, p.attempt)],
                    vertex=edge.source,  # (descriptor version 3 names the producer, and the key of a keyed input)
                )
            )
        else:
            template = (
                _old_partition_path(job.storage_root, job.job_id, edge.source, 0, 0)[:-4] + "/{subtask}/{attempt}"
            )
            attempts = producer.moved_attempts(job.floor)
            inputs.append(
                TaskInput(
                    producer=ProducerPartitions(template, len(producer.subtasks), attempts, job.floor),
                    key_groups=list(key_group_range(maxp, len(vertex.subtasks), ex.subtask)),
                    consumer=ex.subtask,
                    vertex=edge.source,
                    key=edge.key,
                )
            )
    output = None
    if vertex.outputs:
        keyed = next((e.key for e in vertex.outputs if e.exchange == "keyed"), None)
        consumers = max(len(job.vertices[e.target].subtasks) for e in vertex.outputs)
        output = TaskOutput(
            _old_partition_path(job.storage_root, job.job_id, ex.vertex, ex.subtask, ex.attempt), keyed, consumers
        )
    source = sink = queryable = None
    if spec.source is not None:
        plan = job.splits.get(ex.vertex) or [None]
        source = TaskSource(
            spec.source.format, dict(spec.source.options), spec.source.protocol, plan[0], spec.source.each_split
        )
    if spec.sink is not None:
        sink = TaskSink(spec.sink.format, spec.sink.path, dict(spec.sink.options))
    if spec.queryable is not None:
        queryable = TaskQueryable(spec.queryable, next((e.key for e in vertex.inputs if e.exchange == "keyed"), None))
    return TaskDeploymentDescriptor(
        job.job_id,
        ex.id,
        ex.vertex,
        ex.subtask,
        ex.attempt,
        len(vertex.subtasks),
        maxp,
        spec.kind,
        job.code_blob,
        job.module,
        list(spec.functions),
        dict(job.params),
        inputs,
        output,
        source,
        sink,
        queryable,
        job.storage_root,
    )  # (descriptor version 2 added the storage root)


def identity(df):
    return df


@given(
    st.text(min_size=1, max_size=30),
    st.text(min_size=1, max_size=12),
    st.integers(0, 10_000),
    st.integers(0, 2**40),
    st.sampled_from(["file:///tmp/s", "file:///tmp/s/", "s3://b/x/", "/plain"]),
)
def test_partition_paths_are_the_same(vertex: str, job_id: str, subtask: int, attempt: int, root: str) -> None:
    assert partition_path(root, job_id, vertex, subtask, attempt) == _old_partition_path(
        root, job_id, vertex, subtask, attempt
    )


def _run(j: Job, params: dict[str, str]) -> JobRun:
    state = JobsState()
    msg = SubmitJob("job-1", j.graph(), "blob", "mod", "reply", params)
    splits = {v.name: [{"path": "/in.txt", "start": 0, "length": 2}] for v in j.graph().vertices if v.source}
    core.decide(state, core.Submit(msg, splits, "file:///tmp/storage", 3), 0)
    return state.jobs["job-1"]


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.booleans(), st.booleans())
def test_descriptors_are_the_same(p_src: int, p_map: int, keyed: bool, queryable: bool) -> None:
    j = Job("laws", max_parallelism=128)
    p_map = p_map if keyed else p_src  # a forward exchange keeps the parallelism
    src = j.read_text("src", "/in.txt", parallelism=p_src)
    stream = (
        src.key_by("value").map("agg", identity, parallelism=p_map, queryable="q" if queryable else None)
        if keyed
        else src.map("m", identity, parallelism=p_map)
    )
    stream.map("post", identity, parallelism=p_map).write_parquet("out", "/tmp/out", parallelism=p_map)
    run = _run(j, {"a": "1"})
    for vertex in run.vertices.values():
        for ex in vertex.subtasks:
            assert descriptor(run, ex) == _old_descriptor(run, ex)
