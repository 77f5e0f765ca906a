"""Writing a job: a small typed builder for JobGraphs.

A job file is a Python module with a function ``job(params) -> JobGraph``::

    from sluice.api import Job

    def tokenize(lines):            # DataFrame -> DataFrame, runs on Spark
        return lines.select(F.explode(F.split("value", r"\\s+")).alias("word"))

    def count(words):
        return words.groupBy("word").count()

    def job(params):
        j = Job("wordcount")
        lines = j.read_text("lines", params["input"], parallelism=4)
        words = lines.map("tokenize", tokenize)
        counts = words.key_by("word").map("count", count, parallelism=2, queryable="word-counts")
        counts.write_parquet("out", params["output"])
        return j.graph()

Transforms must be functions defined at module level (TaskManagers import them from
the job's code by name); ``map`` with several inputs (``also=[...]``) passes one DataFrame
per input. ``a.key_by("k").join(b.key_by("k"), "join", fn)`` is a keyed join: both sides
are hashed into the same key groups, so ``fn(a_rows, b_rows)`` gets each key's rows from
both. ``big.map("enrich", fn, also=[small.broadcast()])`` gives every subtask all of
``small`` (within the job's ``broadcast_limit_bytes``). See docs/api.md.
A keyed ``map`` may publish its result per key as queryable state (``queryable="name"``):
``sluice state get JOB name KEY`` then reads any key's row (see :mod:`sluice.state`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import orjson

from sluice.events import (
    DEFAULT_BROADCAST_LIMIT_BYTES,
    DEFAULT_MAX_PARALLELISM,
    JobEdge,
    JobGraph,
    JobVertex,
    RestartStrategy,
    SinkSpec,
    SourceSpec,
)

__all__ = ["Job", "Stream", "Keyed", "Broadcast", "function_ref", "task_context"]

DEFAULT_SPLIT_BYTES = None
"""A file source's split size unless given: chosen when the job is submitted from the
input's size and the source's parallelism, as Spark's maxPartitionBytes/openCostInBytes
(``services/dataplane/splits.auto_split_bytes``)."""
NOOP_KEY = "_"


def _split_bytes(given: int | None) -> int:
    """A file source's ``split_bytes`` as its spec holds it: 0 (None given) is chosen from the
    input when the job is submitted; validation refuses one below 1 given."""
    if given is None:
        return 0
    if isinstance(given, bool) or not isinstance(given, int) or given < 1:
        raise ValueError(
            f"split_bytes must be a positive int (bytes per split) or None (chosen from the input's size), got {given!r}"
        )
    return given


"""The key named by an edge between no-op vertices (nothing is exchanged by it)."""


def function_ref(fn: Callable) -> str:
    """``module:qualname`` of a transform (validated later: it must be importable by name)."""
    module = getattr(fn, "__module__", None) or "?"
    qualname = getattr(fn, "__qualname__", None) or repr(fn)
    return f"{module}:{qualname}"


class Stream:
    """The output of a vertex, to be consumed by later vertices."""

    def __init__(self, job: Job, name: str, parallelism: int) -> None:
        self.job, self.name, self.parallelism = job, name, parallelism

    def map(
        self, name: str, fn: Callable, *, parallelism: int | None = None, also: list[Input] | None = None
    ) -> Stream:
        """Transform this stream (forward: subtask i reads subtask i, equal parallelism).
        Chained into the upstream task when nothing else consumes it, as Flink chains.
        With ``also`` (more streams, each forward, keyed or ``broadcast()``), ``fn`` gets one
        DataFrame per input, this stream's first: ``flights.map("enrich", fn,
        also=[planes.broadcast()])`` is a broadcast join."""
        return self.job._transform(name, fn, [self, *(also or [])], parallelism or self.parallelism)

    def with_coordinator(self, coordinator: type) -> Stream:
        """Give the vertex producing this stream an OperatorCoordinator (a class defined at
        the top level of the job file, subclassing
        ``sluice.services.coordination.coordinator.OperatorCoordinator``); its subtasks
        talk to it through ``task_context()``."""
        for i, v in enumerate(self.job.vertices):
            if v.name == self.name:
                self.job.vertices[i] = replace(v, coordinator=function_ref(coordinator))
                return self
        raise ValueError(f"no vertex {self.name!r} in job {self.job.name!r}")

    def key_by(self, key: str, *, max_parallelism: int | None = None) -> Keyed:
        """Partition by ``key`` for the next transform: each key's rows go to one subtask.
        The key is hashed into ``max_parallelism`` key groups (default: the job's); the keyed
        inputs of one transform (a join's sides) must agree on it."""
        return Keyed(self, key, max_parallelism)

    def broadcast(self) -> Broadcast:
        """This stream as an input that every subtask of its consumer reads whole (all of this
        vertex's partitions), as Flink's broadcast partitioning: for a small table joined to
        a large one without shuffling the large one. What the producer publishes is checked
        against the job's ``broadcast_limit_bytes`` (default 64 MiB)."""
        return Broadcast(self)

    def write_parquet(self, name: str, path: str, *, parallelism: int | None = None) -> None:
        self.job._sink(name, SinkSpec("parquet", path), self, parallelism or self.parallelism)

    def write_csv(self, name: str, path: str, *, header: bool = True, parallelism: int | None = None) -> None:
        self.job._sink(
            name, SinkSpec("csv", path, {"header": str(header).lower()}), self, parallelism or self.parallelism
        )


class Keyed:
    """A stream partitioned by a key column for the next transform (``Stream.key_by``)."""

    def __init__(self, stream: Stream, key: str, max_parallelism: int | None = None) -> None:
        self.stream, self.key, self.max_parallelism = stream, key, max_parallelism

    def map(
        self,
        name: str,
        fn: Callable,
        *,
        parallelism: int | None = None,
        queryable: str | None = None,
        also: list[Input] | None = None,
    ) -> Stream:
        """Transform each key's rows (the subtask owning the key's key group gets them all).
        With ``queryable`` the result (one row per key; it must keep the key column) is
        published as queryable state under that name.

        With ``also``, a keyed transform of several inputs (Flink's ``connect``/``coGroup``):
        ``fn`` gets one DataFrame per input, this one's first. Other keyed inputs are
        co-partitioned with this one: each is hashed into the same key groups, and a
        subtask gets the same key groups of every input, so equal keys meet. A
        ``broadcast()`` input comes whole to every subtask."""
        return self.stream.job._transform(
            name, fn, [self, *(also or [])], parallelism or self.stream.parallelism, queryable
        )

    def join(
        self,
        other: Keyed | Broadcast,
        name: str,
        fn: Callable,
        *,
        parallelism: int | None = None,
        queryable: str | None = None,
    ) -> Stream:
        """A keyed join: ``fn(this, other)`` gets this input's rows of the subtask's key groups
        and ``other``'s rows of the same key groups (co-partitioned: the same hash and key
        groups on both sides), or all of ``other`` when it is a ``broadcast()``. ``fn`` joins
        them as it likes (inner, outer, anti, or a cogroup), with Spark:
        ``a.key_by("k").join(b.key_by("k"), "joined", fn)``."""
        return self.map(name, fn, parallelism=parallelism, queryable=queryable, also=[other])


class Broadcast:
    """A stream every subtask of its consumer reads whole (``Stream.broadcast``)."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream


Input = Stream | Keyed | Broadcast
"""What a transform reads: a stream (forward), a keyed stream, or a broadcast stream."""


class Job:
    def __init__(
        self,
        name: str,
        *,
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
        restart: RestartStrategy | None = None,
        chaining: bool = True,
        retry_on: list[str | type] | None = None,
        no_retry_on: list[str | type] | None = None,
        broadcast_limit_bytes: int = DEFAULT_BROADCAST_LIMIT_BYTES,
    ) -> None:
        """``retry_on`` / ``no_retry_on``: exception classes (or their names, or Spark error
        conditions such as ``"CAST_INVALID_INPUT"``) whose failures are retried by the
        restart strategy, or fail the job at once. By default a deterministic user error
        (an AnalysisException, an ANSI cast error, an ImportError of the job's code) fails
        the job at once, and any other failure is retried."""
        self.name = name
        self.max_parallelism = max_parallelism
        self.broadcast_limit_bytes = broadcast_limit_bytes
        self.restart = restart or RestartStrategy()
        if retry_on is not None or no_retry_on is not None:
            self.restart = replace(
                self.restart,
                retry_on=[_exception_name(e) for e in retry_on or self.restart.retry_on],
                no_retry_on=[_exception_name(e) for e in no_retry_on or self.restart.no_retry_on],
            )
        self.chaining = chaining
        self.vertices: list[JobVertex] = []
        self.edges: list[JobEdge] = []

    # --- sources ---
    # Every source's readers ask its coordinator for splits one at a time, so a fast reader
    # takes more than a slow one. ``protocol``: "operator-events" (FLIP-27, the default) or
    # "input-splits" (the seed protocol, RequestNextInputSplit); both balance the same way.
    # ``each_split=True``: the functions chained to the source (the maps before its first
    # exchange) run on each split's rows alone, as the split arrives, and a reader asks for
    # the next split only when that work is done, so the Spark work is balanced across
    # readers, not only the reading. The subtask's output is the union of the results: right
    # for row-by-row functions and for a combiner whose consumer aggregates again (word
    # count's partial count), wrong for one that needs all of a subtask's rows at once (a
    # distinct, or an aggregate that is final). Each split then costs one Spark job.
    # Reader options: checked when the job is submitted (services/dataplane/options.py), each
    # applied alike to every split; ``options`` passes any other reader option the format
    # knows (Spark's names, e.g. {"dateFormat": "yyyy-MM-dd"}); an unknown one is refused.
    def read_text(
        self,
        name: str,
        paths: str | list[str],
        *,
        parallelism: int = 2,
        encoding: str | None = None,
        split_bytes: int | None = DEFAULT_SPLIT_BYTES,
        protocol: str = "operator-events",
        each_split: bool = False,
        options: dict[str, str] | None = None,
    ) -> Stream:
        """Lines of text, one column ``value``. ``encoding``: the files' charset (default
        UTF-8; an ASCII-compatible one, as splits are cut at newline bytes), decoded by Sluice
        as Spark's text reader has no such option."""
        opts = _options(options, encoding=encoding)
        return self._source(
            name, SourceSpec("text", _list(paths), _split_bytes(split_bytes), opts, protocol, each_split), parallelism
        )

    def read_csv(
        self,
        name: str,
        paths: str | list[str],
        *,
        parallelism: int = 2,
        header: bool = True,
        infer_schema: bool = True,
        sep: str | None = None,
        quote: str | None = None,
        null_value: str | None = None,
        schema: object | None = None,
        mode: str | None = None,
        encoding: str | None = None,
        multi_line: bool = False,
        split_bytes: int | None = DEFAULT_SPLIT_BYTES,
        protocol: str = "operator-events",
        each_split: bool = False,
        options: dict[str, str] | None = None,
    ) -> Stream:
        """CSV files, read as Spark's ``spark.read.csv`` reads them with the same options:
        ``sep`` and ``quote`` (one character; ``quote=""`` turns quoting off), ``null_value``
        (the text read as null, e.g. ``"NA"``), ``schema`` (a DDL string ``"a INT, b STRING"``
        or a pyspark ``StructType``; give one for types that agree across splits, since
        ``infer_schema`` infers them split by split; a schema turns inference off), ``mode``
        (PERMISSIVE, DROPMALFORMED or FAILFAST) and ``encoding``. Files are split at line
        ends, where a newline ends a record even inside quotes, as in Spark without
        ``multiLine``; ``multi_line=True`` reads each file whole (one split a file), so a
        quoted field may hold newlines."""
        opts = _options(
            options,
            header=_flag(header),
            inferSchema=_flag(infer_schema and schema is None),
            sep=sep,
            quote=quote,
            nullValue=null_value,
            schema=_schema(schema),
            mode=mode,
            encoding=encoding,
            multiLine=_flag(multi_line) if multi_line else None,
        )
        return self._source(
            name, SourceSpec("csv", _list(paths), _split_bytes(split_bytes), opts, protocol, each_split), parallelism
        )

    def read_json(
        self,
        name: str,
        paths: str | list[str],
        *,
        parallelism: int = 2,
        schema: object | None = None,
        mode: str | None = None,
        encoding: str | None = None,
        multi_line: bool = False,
        split_bytes: int | None = DEFAULT_SPLIT_BYTES,
        protocol: str = "operator-events",
        each_split: bool = False,
        options: dict[str, str] | None = None,
    ) -> Stream:
        """JSON lines (one object a line), read as ``spark.read.json`` reads them and split
        as text is; ``schema`` (DDL or ``StructType``; without one each reader infers its
        own), ``mode`` and ``encoding`` as for CSV. ``multi_line=True``: each file is one
        JSON document or array, read whole (one split a file)."""
        opts = _options(
            options,
            schema=_schema(schema),
            mode=mode,
            encoding=encoding,
            multiLine=_flag(multi_line) if multi_line else None,
        )
        return self._source(
            name, SourceSpec("json", _list(paths), _split_bytes(split_bytes), opts, protocol, each_split), parallelism
        )

    def read_parquet(
        self,
        name: str,
        paths: str | list[str],
        *,
        parallelism: int = 2,
        columns: list[str] | None = None,
        split_bytes: int | None = DEFAULT_SPLIT_BYTES,
        protocol: str = "operator-events",
        each_split: bool = False,
        options: dict[str, str] | None = None,
    ) -> Stream:
        """Parquet files, split by row groups. ``columns``: read only these (in this order):
        the other columns' bytes are never fetched, and Spark's scan reads only these."""
        cols = None if columns is None else orjson.dumps(_names(columns)).decode()
        opts = _options(options, columns=cols)
        return self._source(
            name,
            SourceSpec("parquet", _list(paths), _split_bytes(split_bytes), opts, protocol, each_split),
            parallelism,
        )

    def read_range(
        self,
        name: str,
        start: int,
        end: int,
        *,
        per_split: int = 1_000_000,
        parallelism: int = 2,
        protocol: str = "operator-events",
        each_split: bool = False,
    ) -> Stream:
        """The numbers ``start`` .. ``end - 1`` in a column ``id`` (like ``spark.range``), in
        splits of ``per_split`` numbers."""
        spec = SourceSpec(
            "range", [], per_split, {"start": str(int(start)), "end": str(int(end))}, protocol, each_split
        )
        return self._source(name, spec, parallelism)

    def noop(self, name: str, *, parallelism: int = 1, after: str | None = None) -> None:
        """Tasks that do nothing: they exercise the whole control plane (scheduling, deployment,
        RQ, state reports) without Spark; for smoke tests and benchmarks. ``after``: another
        no-op vertex whose every subtask feeds every subtask of this one (all-to-all, as a
        keyed exchange is), so these start once all of those finished."""
        self.vertices.append(JobVertex(name, "noop", parallelism))
        if after is not None:
            self.edges.append(JobEdge(after, name, "keyed", NOOP_KEY))

    # --- building ---
    def graph(self) -> JobGraph:
        return JobGraph(
            self.name,
            list(self.vertices),
            list(self.edges),
            self.max_parallelism,
            self.restart,
            self.broadcast_limit_bytes,
        )

    def _source(self, name: str, spec: SourceSpec, parallelism: int) -> Stream:
        self.vertices.append(JobVertex(name, "source", parallelism, source=spec))
        return Stream(self, name, parallelism)

    def _chainable(self, upstream: Stream, parallelism: int) -> int | None:
        """Index of ``upstream``'s vertex if an operator can join its chain."""
        if not self.chaining or parallelism != upstream.parallelism:
            return None
        if any(e.source == upstream.name for e in self.edges):
            return None  # someone else consumes it already
        for i, v in enumerate(self.vertices):
            if v.name == upstream.name and v.sink is None:
                return i
        return None

    def _transform(
        self, name: str, fn: Callable, inputs: list[Input], parallelism: int, queryable: str | None = None
    ) -> Stream:
        ref = function_ref(fn)
        if len(inputs) == 1 and isinstance(inputs[0], Stream):
            i = self._chainable(inputs[0], parallelism)
            if i is not None:
                v = self.vertices[i]
                chained = f"{v.name} -> {name}"
                self.vertices[i] = replace(v, name=chained, functions=[*v.functions, ref])
                self.edges = [replace(e, target=chained) if e.target == v.name else e for e in self.edges]
                return Stream(self, chained, parallelism)
        self.vertices.append(JobVertex(name, "transform", parallelism, functions=[ref], queryable=queryable))
        for inp in inputs:
            if isinstance(inp, Keyed):
                self.edges.append(JobEdge(inp.stream.name, name, "keyed", inp.key, inp.max_parallelism))
            elif isinstance(inp, Broadcast):
                self.edges.append(JobEdge(inp.stream.name, name, "broadcast"))
            elif isinstance(inp, Stream):
                self.edges.append(JobEdge(inp.name, name, "forward"))
            else:
                raise TypeError(
                    f"transform {name!r} got {inp!r} as an input: use a Stream, stream.key_by(col) or "
                    "stream.broadcast()"
                )
        return Stream(self, name, parallelism)

    def _sink(self, name: str, spec: SinkSpec, inp: Stream, parallelism: int) -> None:
        i = self._chainable(inp, parallelism)
        if i is not None:
            v = self.vertices[i]
            chained = f"{v.name} -> {name}"
            self.vertices[i] = replace(v, name=chained, sink=spec)
            self.edges = [replace(e, target=chained) if e.target == v.name else e for e in self.edges]
            return
        self.vertices.append(JobVertex(name, "sink", parallelism, sink=spec))
        self.edges.append(JobEdge(inp.name, name, "forward"))


def _list(paths: str | list[str]) -> list[str]:
    return [paths] if isinstance(paths, str) else list(paths)


def _flag(value: bool) -> str:
    return str(bool(value)).lower()


def _options(extra: dict[str, str] | None, **named: str | None) -> dict[str, str]:
    """A source's options: ``extra`` (any the format knows, checked at submission), then
    the named ones that were given. An option that has its own argument is refused in
    ``extra``, at once (which of the two would count?)."""
    out = dict(extra or {})
    for key in out:
        if str(key).lower() in {k.lower() for k in named}:
            raise ValueError(
                f"reader option {key!r} has its own argument: pass it as {_ARGUMENTS.get(key.lower(), key)}=..., "
                "not in options="
            )
    out.update({k: v for k, v in named.items() if v is not None})
    return out


_ARGUMENTS = {
    "infer_schema": "infer_schema",
    "inferschema": "infer_schema",
    "nullvalue": "null_value",
    "multiline": "multi_line",
}


def _schema(schema: object | None) -> str | None:
    """A schema as DDL text: a string as it is, a pyspark StructType converted (the graph is JSON)."""
    if schema is None:
        return None
    from sluice.services.dataplane.ddl import to_ddl

    return to_ddl(schema)


def _names(columns: object) -> list[str]:
    if isinstance(columns, str) or not isinstance(columns, (list, tuple)):
        raise TypeError(f"columns must be a list of column names, got {columns!r}")
    return list(columns)


def _exception_name(e: object) -> str:
    """An exception class as its name: a builtin's bare (``ValueError``), others qualified."""
    if isinstance(e, type):
        return e.__qualname__ if e.__module__ == "builtins" else f"{e.__module__}.{e.__qualname__}"
    return e  # type: ignore[return-value]  # (a name already; validation checks it)


def task_context():
    """Inside a transform of a running task: this subtask's line to its vertex's
    coordinator (``send_to_coordinator(body)``, ``next_event(timeout_s)``, ``subtask``,
    ``attempt``)."""
    from sluice.services.taskmanager.events import current

    return current()
