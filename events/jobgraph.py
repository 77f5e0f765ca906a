"""The JobGraph: what a user submits (vertices, edges, parallelism), as plain records.

Built by the typed API in :mod:`sluice.api`, validated by :mod:`sluice.services.jobs.validate`,
carried inside ``SubmitJob`` and ``JobSubmitted``.
"""

from __future__ import annotations

from dataclasses import field

from .schema import record

__all__ = [
    "SourceSpec",
    "SinkSpec",
    "JobVertex",
    "JobEdge",
    "JobGraph",
    "RestartStrategy",
    "EXCHANGES",
    "DEFAULT_BROADCAST_LIMIT_BYTES",
]

EXCHANGES = ("forward", "keyed", "broadcast")
"""How data flows along an edge (``JobEdge.exchange``)."""

DEFAULT_BROADCAST_LIMIT_BYTES = 64 * 1024 * 1024
"""The most a broadcast input's producer may publish (all its partitions together), unless
the job sets another limit (``JobGraph.broadcast_limit_bytes``)."""


@record
class SourceSpec:
    """What a source reads, in splits: files (``format`` text, csv, json or parquet;
    ``split_bytes`` per split) or numbers (``format`` range: ``options`` start and end,
    ``split_bytes`` numbers per split). ``options`` are the reader's (Spark's names, text
    values; services/dataplane/options.py lists each format's and checks them). ``protocol`` is how its readers get splits:
    ``operator-events`` (FLIP-27, from the source coordinator's enumerator) or
    ``input-splits`` (the seed protocol, ``RequestNextInputSplit``); both are answered by
    the same assignment core. ``each_split``: the functions chained to the source run on
    each split's rows alone, as the split arrives, and a reader asks for the next split only
    once that work is done (so the Spark work is balanced, not only the reading); the
    subtask's output is the union of the results."""

    format: str
    paths: list[str]
    split_bytes: int
    options: dict[str, str] = field(default_factory=dict)
    protocol: str = "operator-events"
    each_split: bool = False


@record
class SinkSpec:
    format: str
    path: str
    options: dict[str, str] = field(default_factory=dict)


@record
class JobVertex:
    """One task's work: a chain of operators that run together, as Flink chains operators
    connected forward with equal parallelism. ``kind`` says how the chain starts: a source
    (reads ``source``), a transform (reads its inputs) or a sink (only writes). Then each of
    ``functions`` (``module:qualname`` in the job's code, DataFrame -> DataFrame) is applied
    in order, and the result is written to ``sink`` if there is one, and handed to the
    vertex's consumers if it has any. ``coordinator`` (``module:qualname`` of an
    ``OperatorCoordinator`` class in the job's code) gives a non-source vertex a
    coordinator on the JobManager; a source always has the source coordinator. A keyed
    vertex with ``queryable`` publishes its result per key under that registration name
    (queryable state; the key is its input's key)."""

    name: str
    kind: str
    parallelism: int
    functions: list[str] = field(default_factory=list)
    source: SourceSpec | None = None
    sink: SinkSpec | None = None
    coordinator: str | None = None
    queryable: str | None = None


@record
class JobEdge:
    """Data flowing from ``source`` to ``target``: ``forward`` (subtask i to subtask i),
    ``keyed`` (rows go to the subtask owning their key's key group) or ``broadcast`` (every
    subtask of ``target`` reads all of ``source``'s partitions).

    A keyed edge hashes ``key`` into ``max_parallelism`` key groups (None: the job's), and
    key groups go to the target's subtasks by contiguous ranges; the keyed inputs of one
    vertex (a join's sides) must use the same number of key groups, so that a key lands on
    the same subtask from every input (``services/jobs/validate.py`` checks it)."""

    source: str
    target: str
    exchange: str
    key: str | None = None
    max_parallelism: int | None = None


@record
class RestartStrategy:
    """``fixed-delay`` (attempts, delay_ms) or ``exponential-backoff`` (attempts, delay_ms
    doubling up to max_delay_ms); ``none`` fails the job at the first task failure.

    A failure its TaskManager classifies as deterministic (a Spark AnalysisException, an
    ANSI cast error, a user-code ImportError: services/taskmanager/failures.py) fails the
    job at once, whatever the strategy. ``no_retry_on`` and ``retry_on`` override that per
    failure: names of exception classes (``ValueError``, ``mymodule.BadRow``) or of Spark
    error conditions (``CAST_INVALID_INPUT``); a failure matching ``no_retry_on`` is never
    retried, one matching ``retry_on`` (and not ``no_retry_on``) is retried as any other."""

    kind: str = "fixed-delay"
    attempts: int = 3
    delay_ms: int = 1000
    max_delay_ms: int = 60_000
    retry_on: list[str] = field(default_factory=list)
    no_retry_on: list[str] = field(default_factory=list)


@record
class JobGraph:
    """``broadcast_limit_bytes``: the most a broadcast input's producer may publish (checked
    when its consumer is deployed; a source read whole is checked at submission too)."""

    name: str
    vertices: list[JobVertex]
    edges: list[JobEdge]
    max_parallelism: int = 128
    restart: RestartStrategy = field(default_factory=RestartStrategy)
    broadcast_limit_bytes: int = DEFAULT_BROADCAST_LIMIT_BYTES
