"""Prometheus metrics of one Sluice process (JobManager, TaskManager or projector).

Each process holds its metrics in its own registry (never prometheus_client's global one),
so several processes' metrics can live in one Python process (the tests, the simulation).
Two kinds:

* counters and histograms the process's loop moves as it goes: events appended and
  handled (by type, counted per batch), dead letters parked, task state changes and
  restarts, the time to recover leadership, split round trips;
* gauges read at scrape time (``gauges.py``) from what the process holds in memory
  (slots, tasks by state, jobs by status) and, through ``store/metrics_reads.py``, from
  Redis (inbox lag and pending entries, dead-letter streams), so the loop pays nothing.

``serve`` starts prometheus_client's HTTP server on a daemon thread.

Names follow Prometheus's conventions: ``sluice_`` first, the unit in the name
(``_seconds``, ``_entries``), ``_total`` on counters (prometheus_client adds it).
"""

from __future__ import annotations

import errno
import threading
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from sluice.errors import ConfigError
from sluice.events import (
    Envelope,
    Event,
    NextInputSplit,
    OperatorEvent,
    RequestNextInputSplit,
    TaskRestartScheduled,
    UpdateTaskExecutionState,
)
from sluice.services.coordination.source import NO_MORE, REQUEST, SPLIT

from .shell import hostname

__all__ = [
    "Metrics",
    "JobManagerMetrics",
    "TaskManagerMetrics",
    "ProjectorMetrics",
    "StateCollector",
    "Endpoint",
    "serve",
]

RECOVERY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
SPLIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_ASKED_KEPT = 100_000  # split requests awaiting their answer, remembered at most


class Metrics:
    """What every process counts: events appended and handled, dead letters parked."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.events_appended = Counter(
            "sluice_events_appended",
            "Events this process appended to the log, by type and by the kind of "
            "stream written (facts, inbox, outbox).",
            ["type", "stream"],
            registry=r,
        )
        self.events_handled = Counter(
            "sluice_events_handled",
            "Events this process read and acted on (inbox messages; facts for the projector), by type.",
            ["type"],
            registry=r,
        )
        self.dead_letters_parked = Counter(
            "sluice_dead_letters_parked",
            "Entries this process parked in a dead-letter stream, by kind of reason.",
            ["kind"],
            registry=r,
        )
        self._children: dict[tuple[Any, ...], Any] = {}

    def _child(self, counter: Counter, *labels: str) -> Any:
        """``counter.labels(*labels)``, looked up once (labels() takes a lock and builds a key)."""
        key = (counter, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = counter.labels(*labels)
        return child

    def handled(self, types: Iterable[str]) -> None:
        for t, n in Tally(types).items():
            self._child(self.events_handled, t).inc(n)

    def appended(self, types: Iterable[str], stream: str) -> None:
        for t, n in Tally(types).items():
            self._child(self.events_appended, t, stream).inc(n)

    def parked(self, kind: str) -> None:
        self._child(self.dead_letters_parked, kind).inc()

    def collect_with(self, read: Callable[[], Iterable[Metric]]) -> None:
        """Add gauges computed at scrape time by ``read``."""
        self.registry.register(StateCollector(read))


class JobManagerMetrics(Metrics):
    def __init__(self) -> None:
        super().__init__()
        r = self.registry
        self.task_transitions = Counter(
            "sluice_task_transitions",
            "Task state changes the leader committed, by the state entered.",
            ["state"],
            registry=r,
        )
        self.restarts = Counter("sluice_task_restarts", "Subtask restarts the leader scheduled.", registry=r)
        self.recovery = Histogram(
            "sluice_leadership_recovery_seconds",
            "From taking the lease to serving: replaying the log "
            "(all of it, or as much as its serve-after time allows), restoring coordinators, recovering what the "
            "last leader left undone.",
            buckets=RECOVERY_BUCKETS,
            registry=r,
        )
        self.all_recovered = Histogram(
            "sluice_leadership_jobs_recovered_seconds",
            "From taking the lease to every live job rebuilt, when "
            "the leader began to serve before (a rebuild longer than its serve-after time).",
            buckets=RECOVERY_BUCKETS,
            registry=r,
        )
        self.split_round_trip = Histogram(
            "sluice_split_round_trip_seconds",
            "From a source subtask's split request (its send time) to the "
            "leader's answer committed (a split, or none left).",
            buckets=SPLIT_BUCKETS,
            registry=r,
        )
        self.log_unreadable = Counter(
            "sluice_log_unreadable",
            "Times this JobManager met a fact it cannot read in the log it was to lead "
            "(and handed the lease over), by kind of reason (e.g. 'unsupported schema version').",
            ["kind"],
            registry=r,
        )
        self._asked: dict[tuple[str, str, int, int], int] = {}

    def handled_entries(self, envs: Sequence[Envelope]) -> None:
        """Inbox messages about to be decided; split requests start their round trip."""
        if not envs:
            return
        types = Tally(e.event.TYPE for e in envs)
        for t, n in types.items():
            self._child(self.events_handled, t).inc(n)
        if RequestNextInputSplit.TYPE not in types and OperatorEvent.TYPE not in types:
            return
        for env in envs:
            key = _request(env.event)
            if key is not None and key not in self._asked:
                if len(self._asked) >= _ASKED_KEPT:
                    self._asked.clear()  # answers lost for good (a job gone): forget, do not grow
                self._asked[key] = env.ts

    def committed(self, envs: Sequence[Envelope], sends: Sequence[Event], now_ms: int) -> None:
        """Facts (and outbox messages) the leader committed."""
        types = Tally(e.event.TYPE for e in envs)
        for t, n in types.items():
            self._child(self.events_appended, t, "facts").inc(n)
        if sends:
            self.appended((ev.TYPE for ev in sends), "outbox")
        if UpdateTaskExecutionState.TYPE in types:
            states = Tally(e.event.state._value_ for e in envs if type(e.event) is UpdateTaskExecutionState)
            for state, n in states.items():
                self._child(self.task_transitions, state).inc(n)
        if TaskRestartScheduled.TYPE in types:
            self.restarts.inc(types[TaskRestartScheduled.TYPE])
        if self._asked and (NextInputSplit.TYPE in types or OperatorEvent.TYPE in types):
            for env in envs:
                key = _answer(env.event)
                if key is not None and key in self._asked:
                    # Across two clocks on purpose (a metric, shown only: no decision reads it):
                    # the subtask's send time, stamped by its host's wall clock, to this
                    # leader's; a skew between hosts moves it by as much (never below 0).
                    self.split_round_trip.observe(max(now_ms - self._asked.pop(key), 0) / 1000)

    def forget(self) -> None:
        """Stepped down: requests read as leader are decided again by the next one."""
        self._asked.clear()


def _request(ev: Event) -> tuple[str, str, int, int] | None:
    if type(ev) is RequestNextInputSplit:
        return ev.job_id, ev.vertex_id, ev.subtask, _attempt(ev.execution_id)
    if type(ev) is OperatorEvent and ev.to_coordinator and isinstance(ev.body, dict) and ev.body.get("type") == REQUEST:
        return ev.job_id, ev.operator_id, ev.subtask, ev.attempt
    return None


def _answer(ev: Event) -> tuple[str, str, int, int] | None:
    if type(ev) is NextInputSplit:
        vertex, subtask, attempt = ev.execution_id.rsplit(":", 2)
        return ev.job_id, vertex, int(subtask), int(attempt)
    if (
        type(ev) is OperatorEvent
        and not ev.to_coordinator
        and isinstance(ev.body, dict)
        and ev.body.get("type") in (SPLIT, NO_MORE)
    ):
        return ev.job_id, ev.operator_id, ev.subtask, ev.attempt
    return None


def _attempt(execution_id: str) -> int:
    try:
        return int(execution_id.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return -1


class TaskManagerMetrics(Metrics):
    def __init__(self) -> None:
        super().__init__()
        self.tasks_ended = Counter(
            "sluice_taskmanager_tasks_ended",
            "Tasks that ended on this TaskManager, by final state.",
            ["state"],
            registry=self.registry,
        )


class ProjectorMetrics(Metrics):
    def __init__(self) -> None:
        super().__init__()
        self.table_writes = Counter(
            "sluice_projector_table_writes",
            "Batches of rows the projector wrote to its read-model tables.",
            registry=self.registry,
        )


# --- gauges at scrape time -------------------------------------------------------------------


class StateCollector(Collector):
    """Gauges computed when scraped, by ``read`` (it runs on the HTTP server's thread while the
    process's loop changes what it reads: a read that meets a dict changing size is tried again)."""

    def __init__(self, read: Callable[[], Iterable[Metric]]) -> None:
        self.read = read

    def collect(self) -> Iterable[Metric]:
        for _ in range(5):
            try:
                return list(self.read())
            except RuntimeError:
                continue  # "dictionary changed size during iteration": the loop moved on; again
        return []

    def describe(self) -> Iterable[Metric]:
        return []  # nothing to check at registration: the gauges' names are fixed


# --- the HTTP endpoint -----------------------------------------------------------------------


class Endpoint:
    """A running metrics server: where it listens, and how to stop it."""

    def __init__(self, server: Any, thread: threading.Thread, url: str) -> None:
        self.server, self.thread, self.url = server, thread, url

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def serve(metrics: Metrics, port: int, host: str = "0.0.0.0", *, option: str = "--metrics-port") -> Endpoint:
    """Serve ``metrics`` at http://HOST:PORT/metrics from a daemon thread. A port that is not
    one, or is taken, is a ConfigError that says what to do (``option``: how the user set it)."""
    if not 1 <= port <= 65535:
        raise ConfigError(
            f"metrics port {port} is not a TCP port: give {option} a port from 1 to 65535, or 0 to serve no metrics"
        )
    try:
        server, thread = start_http_server(port, addr=host, registry=metrics.registry)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"metrics port {port} on {host} is already in use by another process: give {option} "
                "a free port, or 0 to serve no metrics"
            ) from exc
        if exc.errno == errno.EACCES:
            raise ConfigError(
                f"metrics port {port} on {host} needs privileges this process lacks: give {option} "
                "a port above 1023, or 0 to serve no metrics"
            ) from exc
        raise ConfigError(
            f"cannot serve metrics on {host}:{port} ({exc}): check the metrics host, give {option} "
            "another port, or 0 to serve no metrics"
        ) from exc
    shown = hostname() if host in ("", "0.0.0.0", "::") else host
    shown = f"[{shown}]" if ":" in shown else shown
    return Endpoint(server, thread, f"http://{shown}:{server.server_address[1]}/metrics")
