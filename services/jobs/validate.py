"""Validating a JobGraph before it runs: every problem found, each named so a person can fix it."""

from __future__ import annotations

import re
from collections import Counter
from types import ModuleType

from sluice.errors import InvalidJobGraph
from sluice.events import JobEdge, JobGraph
from sluice.services.dataplane import options as reader_options

__all__ = ["InvalidJobGraph", "validate", "problems"]

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
        if e.exchange not in ("forward", "keyed"):
            out.append(f"edge {e.source!r} -> {e.target!r} has exchange {e.exchange!r}; use 'forward' or 'keyed'")
        elif e.exchange == "keyed" and not e.key:
            out.append(f"keyed edge {e.source!r} -> {e.target!r} names no key column")
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
        exchanges = {(e.exchange, e.key) for e in outputs[v.name]}
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
        if not any(e.exchange == "keyed" for e in inputs.get(v.name, [])):
            out.append(
                f"vertex {v.name!r} declares queryable state {v.queryable!r} but is not keyed: its state is "
                "found by key, so key its input first (stream.key_by('col').map(..., queryable=...))"
            )
    for name, vertices in owners.items():
        if len(vertices) > 1:
            out.append(
                f"queryable state name {name!r} is declared by {len(vertices)} vertices "
                f"({', '.join(map(repr, vertices))}); registration names must be unique within a job"
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
