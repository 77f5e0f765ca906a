"""Where a job's partitions live and what a TaskManager is told to run one attempt (its
task deployment descriptor), pure."""

from __future__ import annotations

import functools
import hashlib
import re

from sluice.events import (
    ProducerPartitions,
    TaskDeploymentDescriptor,
    TaskInput,
    TaskOutput,
    TaskQueryable,
    TaskSink,
    TaskSource,
)

from .state import Execution, JobRun

__all__ = ["partition_path", "descriptor"]


def partition_path(storage_root: str, job_id: str, vertex: str, subtask: int, attempt: int) -> str:
    """Where one attempt's result partition lives; the vertex name is made path-safe."""
    return f"{_vertex_dir(storage_root, job_id, vertex)}/{subtask}/{attempt}"


@functools.lru_cache(maxsize=4096)
def _vertex_dir(storage_root: str, job_id: str, vertex: str) -> str:
    """The folder of a vertex's partitions (a regex and a digest: remembered, as every
    deployment of the vertex's subtasks asks for it)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", vertex).strip("_") or "vertex"
    digest = hashlib.sha1(vertex.encode()).hexdigest()[:6]
    return f"{storage_root.rstrip('/')}/{job_id}/{safe}-{digest}"


def descriptor(job: JobRun, ex: Execution) -> TaskDeploymentDescriptor:
    """The task deployment descriptor: everything a TaskManager needs to run this attempt."""
    vertex = job.vertices[ex.vertex]
    spec = vertex.spec
    graph = job.graph
    maxp = graph.max_parallelism
    inputs = []
    for edge in vertex.inputs:
        producer = job.vertices[edge.source]
        if edge.exchange == "forward":
            p = producer.subtasks[ex.subtask]
            inputs.append(
                TaskInput(
                    paths=[partition_path(job.storage_root, job.job_id, edge.source, p.subtask, p.attempt)],
                    vertex=edge.source,
                )
            )
            continue
        # All-to-all (keyed or broadcast): name the producers' partitions compactly (a path
        # template and only the attempts that are not the job's first), so descriptors stay
        # O(1) per consumer, not O(P).
        template = partition_path(job.storage_root, job.job_id, edge.source, 0, 0)[:-4] + "/{subtask}/{attempt}"
        partitions = ProducerPartitions(template, len(producer.subtasks), producer.moved_attempts(job.floor), job.floor)
        if edge.exchange == "broadcast":  # every partition, whole
            inputs.append(
                TaskInput(
                    producer=partitions,
                    consumer=ex.subtask,
                    vertex=edge.source,
                    broadcast_limit=graph.broadcast_limit_bytes,
                )
            )
            continue
        from sluice.services.dataplane.keygroups import key_group_range  # (lazy: the package imports Spark's side)

        groups = edge.max_parallelism or maxp
        inputs.append(
            TaskInput(
                producer=partitions,
                key_groups=list(key_group_range(groups, len(vertex.subtasks), ex.subtask)),
                consumer=ex.subtask,
                vertex=edge.source,
                key=edge.key,
            )
        )
    output = None
    if vertex.outputs:
        # Keyed output is hashed as its keyed consumers read it (validation keeps them to one
        # key and one number of key groups); when they all have one parallelism, it is
        # written one directory per consumer, else one per key group (exact for each).
        keyed, groups_out, consumers, sizes = None, None, 0, set()
        for e in vertex.outputs:  # (loops, not generators: this runs once a deployment)
            n = len(job.vertices[e.target].subtasks)
            consumers = max(consumers, n)
            if e.exchange == "keyed":
                if keyed is None:
                    keyed, groups_out = e.key, e.max_parallelism
                sizes.add(n)
        if keyed is not None and len(sizes) > 1:
            consumers = 0
        elif keyed is not None:
            consumers = sizes.pop()
        output = TaskOutput(
            partition_path(job.storage_root, job.job_id, ex.vertex, ex.subtask, ex.attempt),
            keyed,
            consumers,
            groups_out,
        )
    # The vertex's own key groups (its keyed inputs', validation keeps them equal): its
    # queryable state is registered by them.
    keyed_in = next((e for e in vertex.inputs if e.exchange == "keyed"), None)
    if keyed_in is not None and keyed_in.max_parallelism:
        maxp = keyed_in.max_parallelism
    source = sink = queryable = None
    if spec.source is not None:
        # No splits here: the reader asks the source coordinator for them one at a time.
        # A reader that gets no split still needs the source's schema: it reads the first
        # split's schema (no rows) from this one.
        plan = job.splits.get(ex.vertex) or [None]
        source = TaskSource(
            spec.source.format, dict(spec.source.options), spec.source.protocol, plan[0], spec.source.each_split
        )
    if spec.sink is not None:
        sink = TaskSink(spec.sink.format, spec.sink.path, dict(spec.sink.options))
    if spec.queryable is not None:  # queryable state, keyed by the vertex's input key (services/kvstate)
        queryable = TaskQueryable(spec.queryable, keyed_in.key if keyed_in is not None else None)
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
        list(job.graph.restart.retry_on),
        list(job.graph.restart.no_retry_on),
    )
