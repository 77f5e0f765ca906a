"""The JobGraph: what a user submits (vertices, edges, parallelism), as plain records.

Built by the typed API in :mod:`sluice.api`, validated by :mod:`sluice.services.jobs.validate`,
carried inside ``SubmitJob`` and ``JobSubmitted``.
"""

from __future__ import annotations

from dataclasses import field

from .schema import record

__all__ = ["SourceSpec", "SinkSpec", "JobVertex", "JobEdge", "JobGraph", "RestartStrategy"]


@record
class SourceSpec:
    """Files read in splits: ``format`` text, csv or parquet; ``split_bytes`` per split."""

    format: str
    paths: list[str]
    split_bytes: int
    options: dict[str, str] = field(default_factory=dict)


@record
class SinkSpec:
    format: str
    path: str
    options: dict[str, str] = field(default_factory=dict)


@record
class JobVertex:
    """One operator. ``kind`` is source, transform or sink; ``function`` names the
    transform as ``module:qualname`` inside the job's code."""

    name: str
    kind: str
    parallelism: int
    function: str | None = None
    source: SourceSpec | None = None
    sink: SinkSpec | None = None


@record
class JobEdge:
    """Data flowing from ``source`` to ``target``: ``forward`` (subtask i to subtask i) or
    ``keyed`` (rows go to the subtask owning their key's key group)."""

    source: str
    target: str
    exchange: str
    key: str | None = None


@record
class RestartStrategy:
    """``fixed-delay`` (attempts, delay_ms) or ``exponential-backoff`` (attempts, delay_ms
    doubling up to max_delay_ms); ``none`` fails the job at the first task failure."""

    kind: str = "fixed-delay"
    attempts: int = 3
    delay_ms: int = 1000
    max_delay_ms: int = 60_000


@record
class JobGraph:
    name: str
    vertices: list[JobVertex]
    edges: list[JobEdge]
    max_parallelism: int = 128
    restart: RestartStrategy = field(default_factory=RestartStrategy)
