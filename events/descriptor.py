"""The task deployment descriptor: everything a TaskManager needs to run one attempt.

Built by the jobs core when it deploys an attempt, carried in ``SubmitTask``, handed to
the slot's worker as JSON (RQ's JSON serializer: never pickle) and decoded there with the
same strict decoder as every event, so a field that is missing, mistyped or unexpected is
an error naming it. ``version`` says which shape it has; an older descriptor is upgraded
by ``upgrade`` before it is decoded.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

import orjson

from sluice.errors import UnsupportedSchemaVersion

from .schema import JSON, payload_decoder, record

__all__ = [
    "TaskDeploymentDescriptor",
    "TaskInput",
    "ProducerPartitions",
    "TaskOutput",
    "TaskSource",
    "TaskSink",
    "TaskQueryable",
    "DESCRIPTOR_VERSION",
    "descriptor_from_json",
    "descriptor_to_json",
]

DESCRIPTOR_VERSION = 4
"""Version 2 added ``storage_root``, version 3 ``retry_on`` and ``no_retry_on``, version 4 the
inputs' ``vertex``, ``key`` and ``broadcast_limit`` and the output's ``max_parallelism`` (joins
and broadcast inputs)."""


@record
class ProducerPartitions:
    """An all-to-all input's producers, compactly: a path template (``{subtask}``,
    ``{attempt}``), how many subtasks, and the attempt of each subtask not at ``base``."""

    template: str
    subtasks: int
    attempts: dict[str, int]
    base: int = 0


@record
class TaskInput:
    """One input: the forward producer's partition (``paths``), or every producer's
    (``producer``) read for this consumer's key groups ``key_groups`` ([first, last]) when
    keyed by ``key``, or whole when a broadcast (``broadcast_limit``: the most the
    producer's partitions may hold together, checked when the task is deployed).
    ``vertex`` names the producer (for messages)."""

    paths: list[str] | None = None
    producer: ProducerPartitions | None = None
    key_groups: list[int] | None = None
    consumer: int | None = None
    vertex: str | None = None
    key: str | None = None
    broadcast_limit: int | None = None

    def partition_paths(self) -> list[str]:
        """The producer partition paths this input names."""
        if self.paths is not None:
            return list(self.paths)
        p = self.producer
        if p is None:
            return []
        return [p.template.format(subtask=i, attempt=p.attempts.get(str(i), p.base)) for i in range(p.subtasks)]


@record
class TaskOutput:
    """The attempt's result partition: where, partitioned by ``key`` (None: one part) into
    ``max_parallelism`` key groups (None: the descriptor's) for ``consumers`` consumer
    subtasks (0: keyed consumers of different parallelism, so one directory per key group)."""

    path: str
    key: str | None
    consumers: int
    max_parallelism: int | None = None


@record
class TaskSource:
    """A source reads splits it asks its coordinator for, by ``protocol``;
    ``schema_split`` (the plan's first split) gives a reader that got none its columns;
    ``each_split``: its chained functions run on each split as it arrives (SourceSpec)."""

    format: str
    options: dict[str, str]
    protocol: str
    schema_split: JSON | None = None
    each_split: bool = False


@record
class TaskSink:
    format: str
    path: str
    options: dict[str, str]


@record
class TaskQueryable:
    """Publish the result per key as queryable state named ``name``, keyed by ``key``."""

    name: str
    key: str | None


@record
class TaskDeploymentDescriptor:
    job_id: str
    execution_id: str
    vertex: str
    subtask: int
    attempt: int
    parallelism: int
    max_parallelism: int
    kind: str
    code_blob: str
    module: str
    functions: list[str]
    params: dict[str, str]
    inputs: list[TaskInput]
    output: TaskOutput | None = None
    source: TaskSource | None = None
    sink: TaskSink | None = None
    queryable: TaskQueryable | None = None
    storage_root: str = ""
    """The job's storage root (where its marker is, ``services/common/job_marker.py``): the
    TaskManager checks it sees it before the job's first task there ("": not checked)."""
    retry_on: list[str] = field(default_factory=list)
    no_retry_on: list[str] = field(default_factory=list)
    """The job's word on which failures are retried (``RestartStrategy``): the TaskManager
    classifies a failure with them (services/taskmanager/classify.py)."""
    version: int = DESCRIPTOR_VERSION

    @property
    def task_id(self) -> str:
        return f"{self.job_id}/{self.execution_id}"


_decode = payload_decoder(TaskDeploymentDescriptor)


def upgrade(data: Any) -> Any:
    """An older descriptor's data in the current shape (version 1 is the first; version 2
    added ``storage_root``, unknown for a version 1 descriptor: "", not checked; version 3
    ``retry_on`` and ``no_retry_on``, none before: the defaults decide; version 4 added fields
    that all have defaults)."""
    if not isinstance(data, dict):
        return data
    version = data.get("version", 1)
    if not isinstance(version, int) or version > DESCRIPTOR_VERSION:
        raise UnsupportedSchemaVersion(
            f"a task deployment descriptor of version {version!r} was written by a newer Sluice (this one reads up "
            f"to {DESCRIPTOR_VERSION}); run the same Sluice version on JobManagers and TaskManagers"
        )
    if version == 1:
        data = {**data, "storage_root": "", "version": 2}
    if data.get("version", 1) == 2:
        data = {**data, "retry_on": [], "no_retry_on": [], "version": 3}
    if data.get("version", 1) == 3:
        data = {**data, "version": 4}
    return data


def descriptor_from_json(data: Any) -> TaskDeploymentDescriptor:
    """Decode a descriptor (JSON data, or bytes of JSON) strictly; DecodeError names what is wrong."""
    if isinstance(data, (bytes, str)):
        data = orjson.loads(data)
    if isinstance(data, TaskDeploymentDescriptor):
        return data
    descriptor: TaskDeploymentDescriptor = _decode(upgrade(data))
    return descriptor


def descriptor_to_json(d: TaskDeploymentDescriptor) -> Any:
    """The descriptor as plain JSON data (what RQ carries to the worker)."""
    return orjson.loads(orjson.dumps(d))
