"""Validating a JobGraph before it runs: every problem found, each named so a person can fix it."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from types import ModuleType

from sluice.errors import InvalidJobGraph
from sluice.events import EXCHANGES, JobEdge, JobGraph, JobVertex
from sluice.services.dataplane import options as reader_options

__all__ = ["InvalidJobGraph", "validate", "problems", "broadcast_sizes_known", "broadcast_size_problems", "size_text"]

SOURCE_FORMATS = ("text", "csv", "json", "parquet", "range")
SPLIT_PROTOCOLS = ("operator-events", "input-splits")
SINK_FORMATS = ("parquet", "csv")
RESTARTS = ("fixed-delay", "exponential-backoff", "none")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def validate(graph: JobGraph, module: ModuleType | None = None) -> None:
    found = problems(graph, module)
    if found:
        raise InvalidJobGraph(graph.name, found)


def problems(graph: JobGraph, module: ModuleType | None = None) -> list[str]:
    """Everything wrong with ``graph``; with ``module`` (the job's code, imported), also
    whether every transform can be found in it by name."""
    out: list[str] = []
    maxp = graph.max_parallelism
    if not 1 <= maxp <= 32768:
        out.append(f"max parallelism {maxp} must be between 1 and 32768")
    names = [v.name for v in graph.vertices]
    for name, n in Counter(names).items():
        if n > 1:
            out.append(f"vertex name {name!r} is used {n} times; names must be unique")
    if not graph.vertices:
        out.append("the job has no vertices")
    by_name = {v.name: v for v in graph.vertices}
    inputs: dict[str, list[JobEdge]] = {v.name: [] for v in graph.vertices}
    outputs: dict[str, list[JobEdge]] = {v.name: [] for v in graph.vertices}
    for e in graph.edges:
        for end in (e.source, e.target):
            if end not in by_name:
                out.append(f"edge {e.source!r} -> {e.target!r} refers to a vertex {end!r} that does not exist")
        if e.source in by_name and e.target in by_name:
            inputs[e.target].append(e)
            outputs[e.source].append(e)
        if e.exchange not in EXCHANGES:
            out.append(
                f"edge {e.source!r} -> {e.target!r} has exchange {e.exchange!r}; use {', '.join(map(repr, EXCHANGES))}"
            )
        elif e.exchange == "keyed" and not e.key:
            out.append(f"keyed edge {e.source!r} -> {e.target!r} names no key column")
        elif e.exchange == "keyed" and e.max_parallelism is not None and not _key_groups_ok(e.max_parallelism):
            out.append(
                f"keyed edge {e.source!r} -> {e.target!r} hashes into max_parallelism {e.max_parallelism!r} key groups; "
                "it must be an int between 1 and 32768 (or None: the job's)"
            )
        elif e.exchange == "forward" and e.source in by_name and e.target in by_name:
            ps, pt = by_name[e.source].parallelism, by_name[e.target].parallelism
            if ps != pt:
                out.append(
                    f"forward edge {e.source!r} (parallelism {ps}) -> {e.target!r} (parallelism {pt}) "
                    "needs equal parallelism; use key_by for a redistribution, or give both the same"
                )
    for v in graph.vertices:
        if not 1 <= v.parallelism <= maxp:
            out.append(
                f"vertex {v.name!r} has parallelism {v.parallelism}; it must be between 1 and the max "
                f"parallelism {maxp}"
            )
        if v.kind == "source":
            if v.source is None:
                out.append(f"source {v.name!r} has no source spec")
            elif v.source.format not in SOURCE_FORMATS:
                out.append(
                    f"source {v.name!r} reads format {v.source.format!r}; supported: {', '.join(SOURCE_FORMATS)}"
                )
            else:
                if v.source.split_bytes < (1 if v.source.format == "range" else 0):
                    out.append(
                        f"source {v.name!r} has split size {v.source.split_bytes}; it must be at least 1 "
                        "(or 0 for a file source: chosen from the input's size)"
                    )
                out += [f"source {v.name!r}: {p}" for p in reader_options.problems(v.source.format, v.source.options)]
            if v.source is not None and v.source.protocol not in SPLIT_PROTOCOLS:
                out.append(
                    f"source {v.name!r} asks for splits by protocol {v.source.protocol!r}; use one of "
                    f"{', '.join(SPLIT_PROTOCOLS)}"
                )
            if v.coordinator:
                out.append(
                    f"source {v.name!r} declares coordinator {v.coordinator!r}, but a source's coordinator "
                    "is its split enumerator; give the coordinator to a transform"
                )
            if inputs[v.name]:
                out.append(
                    f"source {v.name!r} has inputs ({', '.join(e.source for e in inputs[v.name])}); sources read files only"
                )
        elif v.kind == "transform":
            if not inputs[v.name]:
                out.append(f"transform {v.name!r} has no input")
            elif v.parallelism > 1 and all(e.exchange == "broadcast" for e in inputs[v.name]):
                out.append(
                    f"transform {v.name!r} reads only broadcast inputs, so each of its {v.parallelism} subtasks would "
                    "compute the same rows (as many copies downstream); give it a forward or keyed input first "
                    "(big.map(name, fn, also=[small.broadcast()])), or parallelism 1"
                )
            if not v.functions:
                out.append(f"transform {v.name!r} names no function")
        elif v.kind == "sink":
            if not inputs[v.name]:
                out.append(f"sink {v.name!r} has no input")
            if v.sink is None:
                out.append(f"sink {v.name!r} has no sink spec")
            elif v.sink.format not in SINK_FORMATS:
                out.append(f"sink {v.name!r} writes format {v.sink.format!r}; supported: {', '.join(SINK_FORMATS)}")
            if outputs[v.name]:
                out.append(f"sink {v.name!r} has outputs; sinks end a pipeline")
        elif v.kind == "noop":
            ends = [e.source for e in inputs[v.name]] + [e.target for e in outputs[v.name]]
            others = sorted({n for n in ends if n in by_name and by_name[n].kind != "noop"})
            if others:
                out.append(
                    f"no-op vertex {v.name!r} is connected to {', '.join(map(repr, others))}; a no-op vertex "
                    "exchanges nothing, so it connects only to other no-op vertices"
                )
            continue
        else:
            out.append(f"vertex {v.name!r} has kind {v.kind!r}; use source, transform, sink or noop")
        for ref in v.functions:
            out += _function_problems(v.name, ref, module)
        if v.coordinator and v.kind != "source":
            out += [p.replace("function", "coordinator", 1) for p in _function_problems(v.name, v.coordinator, module)]
        if v.sink is not None and v.sink.format not in SINK_FORMATS and v.kind != "sink":
            out.append(f"vertex {v.name!r} writes format {v.sink.format!r}; supported: {', '.join(SINK_FORMATS)}")
        # A broadcast consumer reads the producer's partitions whole, whatever their layout.
        exchanges = {
            (e.exchange, e.key, _key_groups(graph, e) if e.exchange == "keyed" else None)
            for e in outputs[v.name]
            if e.exchange != "broadcast"
        }
        if len(exchanges) > 1:
            out.append(
                f"vertex {v.name!r} feeds its consumers through different exchanges {sorted(map(str, exchanges))}; "
                "give each consumer its own upstream transform"
            )
        if not outputs[v.name] and v.sink is None:
            out.append(f"vertex {v.name!r} has no consumer and writes no sink: its result would be lost")
    out += _queryable_problems(graph, inputs)
    cycle = _cycle(graph)
    if cycle:
        out.append(f"the graph has a cycle: {' -> '.join(cycle)}")
    else:
        out += _partitioning_problems(graph, by_name, inputs)
    limit = graph.broadcast_limit_bytes
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        out.append(
            f"broadcast limit {limit!r} must be a positive number of bytes (Job(..., broadcast_limit_bytes=N); "
            "the default is 64 MiB)"
        )
    r = graph.restart
    if r.kind not in RESTARTS:
        out.append(f"restart strategy {r.kind!r} is unknown; use {', '.join(RESTARTS)}")
    if r.attempts < 0 or r.delay_ms < 0 or r.max_delay_ms < r.delay_ms:
        out.append(f"restart strategy {r} needs attempts >= 0, delay_ms >= 0 and max_delay_ms >= delay_ms")
    out += _retry_problems(r.retry_on, r.no_retry_on)
    return out


def _retry_problems(retry_on: list[str], no_retry_on: list[str]) -> list[str]:
    """``retry_on`` / ``no_retry_on``: exception class or Spark error condition names, in one list only."""
    out = []
    for what, names in (("retry_on", retry_on), ("no_retry_on", no_retry_on)):
        for n in names:
            if not isinstance(n, str) or not _NAME.fullmatch(n):
                out.append(
                    f"{what} names {n!r}, which is not an exception class name ('ValueError', 'mymodule.BadRow') "
                    "or a Spark error condition ('CAST_INVALID_INPUT'); give names as strings, not classes"
                )
    both = sorted(set(retry_on) & set(no_retry_on))
    if both:
        out.append(f"{', '.join(map(repr, both))} is in both retry_on and no_retry_on; keep it in one")
    return out


def _queryable_problems(graph: JobGraph, inputs: dict[str, list[JobEdge]]) -> list[str]:
    """Queryable state: a keyed vertex (its state is found by its input's key), one name per vertex."""
    out: list[str] = []
    owners: dict[str, list[str]] = {}
    for v in graph.vertices:
        if v.queryable is None:
            continue
        if not isinstance(v.queryable, str) or not v.queryable.strip() or len(v.queryable) > 200:
            out.append(
                f"vertex {v.name!r} declares queryable state named {v.queryable!r}; use a non-empty name of at "
                "most 200 characters"
            )
            continue
        owners.setdefault(v.queryable, []).append(v.name)
        keyed = [e for e in inputs.get(v.name, []) if e.exchange == "keyed"]
        if not keyed:
            out.append(
                f"vertex {v.name!r} declares queryable state {v.queryable!r} but is not keyed: its state is "
                "found by key, so key its input first (stream.key_by('col').map(..., queryable=...))"
            )
        elif _key_groups(graph, keyed[0]) != graph.max_parallelism:
            out.append(
                f"vertex {v.name!r} declares queryable state {v.queryable!r} but its input is keyed into "
                f"{_key_groups(graph, keyed[0])} key groups, not the job's {graph.max_parallelism}: queryable state "
                "is found by the job's key groups, so key it without max_parallelism=..."
            )
    for name, vertices in owners.items():
        if len(vertices) > 1:
            out.append(
                f"queryable state name {name!r} is declared by {len(vertices)} vertices "
                f"({', '.join(map(repr, vertices))}); registration names must be unique within a job"
            )
    return out


def _key_groups_ok(n: object) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 32768


def _key_groups(graph: JobGraph, edge: JobEdge) -> int:
    """How many key groups a keyed edge hashes into."""
    return edge.max_parallelism if edge.max_parallelism is not None else graph.max_parallelism


def _describe(p: tuple[int, int] | None) -> str:
    if p is None:
        return "not partitioned by key"
    return f"partitioned into {p[0]} key groups over {p[1]} subtasks"


def _partitioning_problems(
    graph: JobGraph, by_name: dict[str, JobVertex], inputs: dict[str, list[JobEdge]]
) -> list[str]:
    """Co-partitioning: a vertex that reads a keyed input reads key-group ranges, so every
    other input it reads (but a broadcast, which comes whole) must hold the same key
    groups in its subtask i: another keyed input hashed into as many key groups, or a
    forward edge from a vertex itself partitioned so. Otherwise equal keys from two inputs
    land on different subtasks and a join silently misses them. (An acyclic graph.)"""
    out: list[str] = []
    memo: dict[str, tuple[int, int] | None] = {}

    def partitioning(name: str) -> tuple[int, int] | None:
        """(key groups, parallelism) when subtask i of ``name`` holds exactly the rows of key
        group range i (Flink's contiguous ranges), else None."""
        if name not in memo:
            v = by_name[name]
            keyed = [e for e in inputs[name] if e.exchange == "keyed"]
            forward = [e for e in inputs[name] if e.exchange == "forward" and e.source in by_name]
            found: tuple[int, int] | None = None
            if keyed:
                found = (_key_groups(graph, keyed[0]), v.parallelism)
            elif forward:
                ups = {partitioning(e.source) for e in forward}
                found = ups.pop() if len(ups) == 1 else None
            memo[name] = found
        return memo[name]

    for v in graph.vertices:
        keyed = [e for e in inputs[v.name] if e.exchange == "keyed"]
        if not keyed:
            continue
        first = keyed[0]
        groups = _key_groups(graph, first)
        for e in keyed[1:]:
            if _key_groups(graph, e) != groups:
                out.append(
                    f"vertex {v.name!r} reads keyed inputs hashed into different numbers of key groups: "
                    f"{first.source!r} (key {first.key!r}, max_parallelism {groups}) and {e.source!r} "
                    f"(key {e.key!r}, max_parallelism {_key_groups(graph, e)}), so equal keys would land on "
                    "different subtasks; key both with the same max_parallelism "
                    "(key_by(col, max_parallelism=N), or neither: the job's)"
                )
        want = (groups, v.parallelism)
        for e in inputs[v.name]:
            if e.exchange != "forward" or e.source not in by_name:
                continue
            got = partitioning(e.source)
            if got != want:
                out.append(
                    f"forward edge {e.source!r} -> {v.name!r} would mis-partition: {v.name!r} reads "
                    f"{first.source!r} keyed by {first.key!r} ({_describe(want)}), but {e.source!r} is "
                    f"{_describe(got)}, so subtask i of {e.source!r} does not hold the keys of subtask i of {v.name!r}; key "
                    f"it instead ({e.source!r} as stream.key_by(col) in the join: "
                    "a.key_by(k).join(b.key_by(k), ...)), or broadcast it (stream.broadcast()) if it is small"
                )
    return out


def broadcast_sizes_known(graph: JobGraph) -> list[JobVertex]:
    """The broadcast producers whose published size is known at submission: a Parquet source
    read whole (no function chained, no reader options), which publishes its input's rows
    as Parquet again, about the size of its files. Others are checked at deployment."""
    broadcast = {e.source for e in graph.edges if e.exchange == "broadcast"}
    return [
        v
        for v in graph.vertices
        if v.name in broadcast
        and v.kind == "source"
        and v.source is not None
        and v.source.format == "parquet"
        and not v.source.options
        and not v.functions
    ]


def size_text(n: int) -> str:
    """``n`` bytes for a person: exact when small, else in KiB, MiB or GiB with the exact count."""
    if n < 1024:
        return f"{n} bytes"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit} ({n} bytes)"
    return f"{n} bytes"  # (not reached)


def broadcast_size_problems(graph: JobGraph, sizes: Mapping[str, int]) -> list[str]:
    """Broadcast producers of known size (``sizes``: vertex -> bytes) above the job's limit."""
    limit = graph.broadcast_limit_bytes
    out = []
    for e in graph.edges:
        size = sizes.get(e.source)
        if e.exchange == "broadcast" and size is not None and size > limit:
            out.append(
                f"broadcast input {e.source!r} of vertex {e.target!r} is {size_text(size)}, above the "
                f"broadcast limit of {size_text(limit)}: every subtask of {e.target!r} would read it "
                "whole; key both sides instead (a.key_by(k).join(b.key_by(k), ...)), or raise the limit with "
                "Job(..., broadcast_limit_bytes=N)"
            )
    return out


def _function_problems(vertex: str, ref: str | None, module: ModuleType | None) -> list[str]:
    if not ref or ":" not in ref:
        return [f"transform {vertex!r} names no function (got {ref!r})"]
    mod, _, qual = ref.partition(":")
    if "<lambda>" in qual or "<locals>" in qual:
        return [
            f"transform {vertex!r} uses {qual!r}, which is not importable by name: define it with def at the "
            "top level of the job file"
        ]
    if module is not None and mod == module.__name__:
        obj: object = module
        for part in qual.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                return [f"transform {vertex!r} names {qual!r}, which the job's module does not define"]
        if not callable(obj):
            return [f"transform {vertex!r} names {qual!r}, which is not callable"]
    elif module is not None:
        import importlib

        try:
            obj = importlib.import_module(mod)
            for part in qual.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as exc:
            return [f"transform {vertex!r} names {ref!r}, which cannot be imported: {exc}"]
    return []


def _cycle(graph: JobGraph) -> list[str] | None:
    succ: dict[str, list[str]] = {v.name: [] for v in graph.vertices}
    for e in graph.edges:
        if e.source in succ and e.target in succ:
            succ[e.source].append(e.target)
    color: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        color[n] = 1
        stack.append(n)
        for m in succ[n]:
            if color.get(m) == 1:
                return stack[stack.index(m) :] + [m]
            if m not in color:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        color[n] = 2
        return None

    for n in succ:
        if n not in color:
            found = visit(n)
            if found:
                return found
    return None
