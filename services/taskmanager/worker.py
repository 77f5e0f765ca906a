"""What runs inside an RQ worker process (one per slot): the task itself, on Spark.

The worker is an RQ ``SimpleWorker`` (no fork per job: a Spark session must never be
forked), so the Spark session and the job's imported code stay warm across tasks. The
task reports its states to the job's inbox itself, and tells its TaskManager when it ended.

When Redis is away, a task waits for it wherever it needs it (a report, a split request,
its inbox, its queryable state) and then does that step again: it keeps what it finished,
and an outage of the log costs time, not a restart. It waits as long as its TaskManager
lives (the worker's parent; ``$SLUICE_WORKER_REDIS_WAIT_S`` caps a single wait, default
one hour), saying once in its log that Redis is away and once that it is back.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

from sluice.errors import PartlyAppended, RedisUnavailable, WrongType
from sluice.events import (
    Envelope,
    ScheduleOrUpdateConsumers,
    TaskDeploymentDescriptor,
    TaskSource,
    TaskState,
    UpdateTaskExecutionState,
    descriptor_from_json,
)
from sluice.services.common.shell import hostname
from sluice.services.common.world import SYSTEM, World
from sluice.store import EventLog, Keys, connect, open_backend, server_address
from sluice.store.connection import Outage
from sluice.store.connection import rq_url as queues_url

from . import events as task_events
from . import share
from .classify import classify
from .inputs import read_task_inputs
from .library import load_module

__all__ = ["run_task", "spark_session", "WorkerContext", "RUN_TASK", "report_state", "report_produced"]

T = TypeVar("T")

RUN_TASK = "sluice.services.taskmanager.worker.run_task"
"""The RQ job function, by name (RQ's JSON serializer carries names, never pickles)."""


@dataclass
class WorkerContext:
    log: EventLog
    resource_id: str
    slot: int
    address: str = ""
    """Where this worker's queryable state is served: its Redis, without the password."""
    outage: Outage | None = None
    """How this worker waits for Redis when it is away (None: it does not wait)."""
    rq: Any = None
    """A client of the Redis of RQ's queues when it is not the log's (None: the log's)."""


_context: WorkerContext | None = None
_spark: Any = None
_spark_lock = threading.Lock()

WAIT_ENV = "SLUICE_WORKER_REDIS_WAIT_S"
"""Seconds a worker waits at most for Redis in one outage (default: an hour; it stops
waiting at once when its TaskManager is gone)."""


def init_worker(url: str, prefix: str, resource_id: str, slot: int, *, rq_url: str | None = None) -> WorkerContext:
    """This process's worker context. If Redis is away (the worker was started, or
    restarted, during an outage) it waits for it instead of dying. ``rq_url``: the Redis
    of RQ's queues when it is not the log's (``$SLUICE_RQ_REDIS_URL``; needed when the log
    is on a Redis Cluster); the worker waits for both."""
    global _context
    queues = queues_url(url, rq_url)
    # One client for both when RQ's queues live with the log (its tasks' messages then go
    # in the queueing transaction); the log on its own backend otherwise (a cluster).
    rq = connect(queues, check=False) if queues != url else None
    backend = open_backend(url, check=False)
    parent = os.getppid()

    def ping() -> None:
        backend.time_ms()  # a round trip to the log's Redis
        if rq is not None:
            rq.ping()

    def owner_gone() -> str | None:
        return None if os.getppid() == parent else f"its TaskManager (pid {parent}) is gone"

    outage = Outage(
        ping,
        who=f"sluice worker {resource_id}/slot {slot}",
        url=url,
        give_up=owner_gone,
        limit_s=float(os.environ.get(WAIT_ENV) or 3600),
    )
    outage.wait()
    _context = WorkerContext(EventLog(backend, Keys(prefix)), resource_id, slot, server_address(url), outage, rq)
    return _context


def spark_session(remote: str | None = None) -> Any:
    """This process's Spark session: a Spark Connect client when $SLUICE_SPARK_REMOTE is set
    (one server per TaskManager, shared by its workers), else a local session on
    $SLUICE_SPARK_MASTER (default local[*])."""
    global _spark
    with _spark_lock:
        return _spark or _new_session(remote)


def _new_session(remote: str | None) -> Any:
    global _spark
    if _spark is None:
        from pyspark.sql import SparkSession

        remote = remote or os.environ.get("SLUICE_SPARK_REMOTE")
        if remote:
            from sluice.services.embedded.spark_connect import wait_listening

            wait_listening(remote)  # its TaskManager may have started it a moment ago
            _spark = SparkSession.builder.remote(remote).getOrCreate()
        else:
            from .spark import driver_conf

            master = os.environ.get("SLUICE_SPARK_MASTER", "local[*]")
            builder = SparkSession.builder.master(master).config("spark.ui.enabled", "false")
            for key, value in driver_conf(master, hostname()).items():  # it answers after an address change
                builder = builder.config(key, value)
            _spark = builder.getOrCreate()
    return _spark


_task_came = threading.Event()
"""Set once this worker has been given a Spark task."""


def warm_up() -> None:
    """Connect to Spark and run a trivial query before the first task arrives, so the first
    task does not pay for the session (a cold session's first query takes seconds). Once a
    task came, the query is left out: on a server that has just started, the task's own
    queries warm it, and a second query beside them only takes CPU from them (measured with
    ``scripts/bench coldstart``)."""

    def run() -> None:
        try:
            spark = spark_session()
            if not _task_came.is_set():
                spark.range(1).count()
        except Exception:  # no Spark yet (or not needed): the first task will say so
            pass

    threading.Thread(target=run, name="spark-warm-up", daemon=True).start()


def report_state(
    log: EventLog,
    world: World,
    d: TaskDeploymentDescriptor,
    resource_id: str,
    slot: int,
    *states: TaskState,
    error: str | None = None,
    retryable: bool = True,
) -> None:
    """A task's state changes, in order, in one round trip: each to its job's inbox, and a
    final one to its TaskManager too (which releases what the task held), the
    TaskManager's first: the leader gives the freed slot to the next attempt as soon as it
    reads the final state, and that SubmitTask must come after the final state in the
    TaskManager's inbox, or it finds the slot still busy and kills the worker (losing its
    warm Spark session)."""
    keys = log.keys
    sends: list[tuple[str, Envelope]] = []
    for state in states:
        ev = UpdateTaskExecutionState(
            d.job_id,
            d.execution_id,
            state,
            error if state.terminal else None,
            d.vertex,
            d.subtask,
            d.attempt,
            resource_id,
            slot,
            retryable=retryable or state != TaskState.FAILED,
        )
        env = Envelope(ev, world.new_id(), 0, world.now_ms(), d.job_id)
        if state.terminal:
            sends.append((keys.inbox(keys.taskmanager(resource_id)), env))
        sends.append((keys.inbox(keys.job(d.job_id)), env))
    if len(sends) == 1:
        log.append(*sends[0])
    else:
        log.append_each(sends)


def report_produced(log: EventLog, world: World, d: TaskDeploymentDescriptor) -> None:
    """The task's result partition is complete: its consumers may be deployed."""
    keys = log.keys
    log.append(
        keys.inbox(keys.job(d.job_id)),
        Envelope(
            ScheduleOrUpdateConsumers(d.job_id, d.execution_id, d.vertex, d.subtask, d.attempt),
            world.new_id(),
            0,
            world.now_ms(),
            d.job_id,
        ),
    )


def _report(
    ctx: WorkerContext,
    d: TaskDeploymentDescriptor,
    *states: TaskState,
    error: str | None = None,
    retryable: bool = True,
) -> None:
    _persist(
        ctx,
        lambda: report_state(ctx.log, SYSTEM, d, ctx.resource_id, ctx.slot, *states, error=error, retryable=retryable),
    )


def _persist(ctx: WorkerContext, send: Callable[[], T], *, give_up_s: float = 600.0, refused_for_s: float = 30.0) -> T:
    """Do a step that writes to Redis, doing it again after Redis was away (a report may
    then arrive twice: the leader ignores a repeated one). A report lost would leave its task
    running for ever, so the worker waits as long as its TaskManager lives; a context with
    no ``outage`` retries for ``give_up_s``. A report an inbox refused (its key holds another
    kind of value again right after it was moved aside) goes again for ``refused_for_s``;
    the others of it may arrive twice."""
    refused_until = time.monotonic() + refused_for_s

    def once() -> T:
        while True:
            try:
                return send()
            except (PartlyAppended, WrongType):
                if time.monotonic() > refused_until:
                    raise
                time.sleep(0.1)

    if ctx.outage is not None:
        return ctx.outage.call(once)
    delay, deadline = 0.05, time.monotonic() + give_up_s
    while True:
        try:
            return once()
        except RedisUnavailable:
            if time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def run_task(data: dict[str, Any], runtime: dict[str, Any]) -> str:
    """Run one execution attempt: read, apply the chain, write; report every state. ``data``
    is the task deployment descriptor as JSON (RQ carries JSON, never pickles)."""
    d = descriptor_from_json(data)
    ctx = _context
    if ctx is None:
        raise RuntimeError("run_task needs a Sluice worker (sluice worker), not a bare RQ worker")
    if d.kind == "noop":  # nothing runs between the two: one round trip
        _report(ctx, d, TaskState.RUNNING, TaskState.FINISHED)
        return "FINISHED"
    _task_came.set()
    _report(ctx, d, TaskState.RUNNING)
    temp_dir = Path(runtime["temp_dir"])
    try:
        _execute(ctx, d, runtime, temp_dir)
    except BaseException as exc:  # the user's error, with its traceback, is the task's cause
        verdict = classify(exc, d.retry_on, d.no_retry_on)
        error = describe_error(exc)
        if verdict.why:  # the root cause says first why the job fails at once
            error = f"{verdict.why}\n{error}"
        _report(ctx, d, TaskState.FAILED, error=error, retryable=verdict.retryable)
        return "FAILED"
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
    _report(ctx, d, TaskState.FINISHED)
    return "FINISHED"


def describe_error(exc: BaseException, limit: int = 8000) -> str:
    """The Python traceback and message, without the JVM's stack frames (Spark appends
    hundreds of "at org.apache…" lines that bury the cause), at most ``limit`` characters."""
    lines = "".join(traceback.format_exception(exc)).splitlines()
    kept, skipped = [], 0
    for line in lines:
        if line.lstrip().startswith("at ") and ("(" in line or "$" in line):
            skipped += 1
            continue
        kept.append(line)
    text = "\n".join(kept).strip()
    if skipped:
        text += f"\n({skipped} JVM stack frames left out)"
    return text if len(text) <= limit else text[: limit - 40] + "\n… (truncated)"


def _execute(ctx: WorkerContext, d: TaskDeploymentDescriptor, runtime: dict[str, Any], temp_dir: Path) -> None:
    spark = spark_session(runtime.get("spark_remote"))
    share.configure(spark, runtime.get("partitions"))
    temp_dir.mkdir(parents=True, exist_ok=True)
    events = task_events.TaskEvents(ctx.log, d, runtime.get("host") or hostname(), outage=ctx.outage)
    task_events.install(events)
    try:
        _run_chain(ctx, d, runtime, temp_dir, spark, events)
    finally:
        task_events.install(None)


def _taken_splits(
    d: TaskDeploymentDescriptor, runtime: dict[str, Any], temp_dir: Path, events: task_events.TaskEvents
) -> Iterator[tuple[int, int] | Path]:
    """Ask the source coordinator for splits until there are none left, each taken as it
    comes: a range of numbers, or the split copied to a file (at most ``io_rate`` bytes a
    second when the TaskManager limits it). The next split is asked for when the caller
    asks for the next item, so work done between two items delays the next request."""
    from sluice.services.dataplane import reader

    source = d.source
    assert source is not None  # the jobs core gives every source vertex's descriptor its TaskSource
    rate = float(runtime.get("io_rate") or 0)
    while (split := events.next_split()) is not None:
        began = time.monotonic()
        item: tuple[int, int] | Path
        if split["format"] == "range":
            item = (int(split["start"]), int(split["end"]))
            size = 8 * (item[1] - item[0])
        else:
            item = reader.materialize_split(split, source.options, temp_dir / "splits")
            size = item.stat().st_size
        if rate > 0:
            time.sleep(max(0.0, size / rate - (time.monotonic() - began)))
        yield item


def _source_frame(spark: Any, source: TaskSource, items: list[tuple[int, int] | Path], temp_dir: Path) -> Any:
    """One DataFrame of taken splits (with none: no rows, but the source's columns)."""
    from sluice.services.dataplane import reader

    if source.format == "range":
        from pyspark.sql import functions as F

        ranges = [item for item in items if isinstance(item, tuple)]
        if not ranges:
            return spark.createDataFrame([], "id long")
        bounds = spark.createDataFrame(ranges, "s long, e long")
        return bounds.select(F.explode(F.sequence("s", F.col("e") - 1)).alias("id"))
    files = [item for item in items if isinstance(item, Path)]
    if not files:  # other readers took every split
        first = source.schema_split
        if first is None or source.format == "text":
            return _empty_source(spark, source)
        path = reader.materialize_split(cast("dict[str, object]", first), source.options, temp_dir / "schema")
        return reader.read_materialized(spark, source.format, source.options, [path]).limit(0)
    return reader.read_materialized(spark, source.format, source.options, files)


def _read_source(
    spark: Any, d: TaskDeploymentDescriptor, runtime: dict[str, Any], temp_dir: Path, events: task_events.TaskEvents
) -> Any:
    """Every split this subtask takes, then one DataFrame of all it read."""
    assert d.source is not None
    return _source_frame(spark, d.source, list(_taken_splits(d, runtime, temp_dir, events)), temp_dir)


def _read_each_split(
    spark: Any,
    d: TaskDeploymentDescriptor,
    runtime: dict[str, Any],
    temp_dir: Path,
    events: task_events.TaskEvents,
    chain: Callable[[Any], Any],
) -> Any:
    """The source's chained functions run on each split as it arrives, each result written
    to a chunk in the task's own temp dir before the next split is asked for; then one
    DataFrame of the chunks (the subtask's output, committed only when the task finishes,
    as a whole-task read's is)."""
    from sluice.services.dataplane.chunks import input_bytes, write_chunk

    assert d.source is not None
    chunks: list[str] = []
    schema = None
    for item in _taken_splits(d, runtime, temp_dir, events):
        df = chain(_source_frame(spark, d.source, [item], temp_dir))
        chunk = temp_dir / "chunks" / f"{len(chunks):06d}"
        written = write_chunk(df, chunk, input_bytes(item))
        schema = schema if schema is not None else written
        chunks.append(str(chunk))
        if isinstance(item, Path):
            item.unlink(missing_ok=True)  # its rows are in the chunk: the copy can go
    if schema is None:  # other readers took every split: the chain's columns, no rows
        return chain(_source_frame(spark, d.source, [], temp_dir))
    return spark.read.schema(schema).parquet(*chunks)


def _run_chain(
    ctx: WorkerContext,
    d: TaskDeploymentDescriptor,
    runtime: dict[str, Any],
    temp_dir: Path,
    spark: Any,
    events: task_events.TaskEvents,
) -> None:
    from sluice.services.dataplane import exchange

    functions: list[Callable[..., Any]] = []
    if d.functions:
        module = load_module(Path(runtime["code_path"]), d.module)
        functions = [_resolve(module, ref) for ref in d.functions]

    partitions = runtime.get("partitions")

    def shared(df: Any) -> Any:  # the task's input as its share of the server (share.py)
        return share.coalesced(df, partitions)

    def chain(df: Any, fns: list[Callable[..., Any]] = functions) -> Any:
        for fn in fns:
            df = fn(df)
        return df

    if d.kind == "source":
        assert d.source is not None
        if d.source.each_split and functions:
            df = shared(_read_each_split(spark, d, runtime, temp_dir, events, lambda split: chain(shared(split))))
        else:
            df = chain(shared(_read_source(spark, d, runtime, temp_dir, events)))
    else:
        inputs = read_task_inputs(spark, d, shared)
        if functions and len(inputs) > 1:  # the first function joins the inputs
            df = chain(functions[0](*inputs), functions[1:])
        else:
            df = chain(inputs[0])
    output = d.output
    queryable = d.queryable
    if queryable and (output or d.sink):
        df = df.cache()  # computed once for the output and for the queryable state
    if output:
        exchange.write_partition(
            df,
            output.path,
            key=output.key,
            max_parallelism=output.max_parallelism or d.max_parallelism,
            consumers=output.consumers if output.key and output.consumers else None,
            partitions=partitions,
        )
    sink = d.sink
    if sink:
        exchange.write_sink(df, sink.path, d.subtask, d.attempt, sink.format, sink.options)
    if queryable:  # services/kvstate/publish.py: write the state, then register it
        from sluice.services.kvstate.publish import publish

        _persist(ctx, lambda: publish(ctx.log, d, df, ctx.address))  # the hash is rewritten whole: repeatable
        if output or sink:
            df.unpersist()
    if output:
        _persist(ctx, lambda: report_produced(ctx.log, SYSTEM, d))


def _empty_source(spark: Any, source: TaskSource) -> Any:
    if source.format == "text":
        return spark.createDataFrame([], "value string")
    from sluice.services.dataplane.options import lookup

    schema = lookup(source.options, "schema")  # a source given a schema has its columns without any split
    return spark.createDataFrame([], str(schema) if schema else "_empty string")


def _resolve(module: Any, ref: str) -> Any:
    mod, _, qual = ref.partition(":")
    obj = module
    if mod != module.__name__:
        import importlib

        obj = importlib.import_module(mod)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj
