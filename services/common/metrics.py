"""Prometheus metrics of one Sluice process (JobManager, TaskManager or projector).

Each process holds its metrics in its own registry (never prometheus_client's global one),
so several processes' metrics can live in one Python process (the tests, the simulation).
Two kinds:

* counters and histograms the process's loop moves as it goes: events appended and
  handled (by type, counted per batch), dead letters parked, task state changes and
  restarts, the time to recover leadership, split round trips;
* gauges read at scrape time from what the process holds in memory (slots, tasks by
  state, jobs by status) and, through ``store/metrics_reads.py``, from Redis (inbox lag
  and pending entries, dead-letter streams), so the loop pays nothing for them.

``serve`` starts prometheus_client's HTTP server on a daemon thread.

Names follow Prometheus's conventions: ``sluice_`` first, the unit in the name
(``_seconds``, ``_entries``), ``_total`` on counters (prometheus_client adds it).
"""

from __future__ import annotations

import errno
import threading
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sluice.errors import ConfigError, SluiceError
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

if TYPE_CHECKING:
    from sluice.services.jobmanager.process import JobManager
    from sluice.services.jobs.state import JobsState
    from sluice.services.membership.core import Membership
    from sluice.services.projector.process import Projector
    from sluice.services.taskmanager.process import TaskManager
    from sluice.store.metrics_reads import InboxReading

__all__ = ["Metrics", "JobManagerMetrics", "TaskManagerMetrics", "ProjectorMetrics", "StateCollector", "Endpoint",
           "serve", "cluster_families", "inbox_families", "dead_letter_family", "taskmanager_families", "store_families",
           "jobmanager_gauges", "taskmanager_gauges", "projector_gauges"]

RECOVERY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
SPLIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_ASKED_KEPT = 100_000  # split requests awaiting their answer, remembered at most


class Metrics:
    """What every process counts: events appended and handled, dead letters parked."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.events_appended = Counter(
            "sluice_events_appended", "Events this process appended to the log, by type and by the kind of "
            "stream written (facts, inbox, outbox).", ["type", "stream"], registry=r)
        self.events_handled = Counter(
            "sluice_events_handled", "Events this process read and acted on (inbox messages; facts for the "
            "projector), by type.", ["type"], registry=r)
        self.dead_letters_parked = Counter(
            "sluice_dead_letters_parked", "Entries this process parked in a dead-letter stream, by kind of "
            "reason.", ["kind"], registry=r)

    def handled(self, types: Iterable[str]) -> None:
        for t, n in Tally(types).items():
            self.events_handled.labels(t).inc(n)

    def appended(self, types: Iterable[str], stream: str) -> None:
        for t, n in Tally(types).items():
            self.events_appended.labels(t, stream).inc(n)

    def parked(self, kind: str) -> None:
        self.dead_letters_parked.labels(kind).inc()

    def collect_with(self, read: Callable[[], Iterable[Metric]]) -> None:
        """Add gauges computed at scrape time by ``read``."""
        self.registry.register(StateCollector(read))


class JobManagerMetrics(Metrics):
    def __init__(self) -> None:
        super().__init__()
        r = self.registry
        self.task_transitions = Counter(
            "sluice_task_transitions", "Task state changes the leader committed, by the state entered.",
            ["state"], registry=r)
        self.restarts = Counter("sluice_task_restarts", "Subtask restarts the leader scheduled.", registry=r)
        self.recovery = Histogram(
            "sluice_leadership_recovery_seconds", "From taking the lease to leading: replaying the log, "
            "restoring coordinators, recovering what the last leader left undone.", buckets=RECOVERY_BUCKETS,
            registry=r)
        self.split_round_trip = Histogram(
            "sluice_split_round_trip_seconds", "From a source subtask's split request (its send time) to the "
            "leader's answer committed (a split, or none left).", buckets=SPLIT_BUCKETS, registry=r)
        self._asked: dict[tuple[str, str, int, int], int] = {}

    def handled_entries(self, envs: Sequence[Envelope]) -> None:
        """Inbox messages about to be decided; split requests start their round trip."""
        if not envs:
            return
        self.handled(e.event.TYPE for e in envs)
        for env in envs:
            key = _request(env.event)
            if key is not None and key not in self._asked:
                if len(self._asked) >= _ASKED_KEPT:
                    self._asked.clear()  # answers lost for good (a job gone): forget, do not grow
                self._asked[key] = env.ts

    def committed(self, envs: Sequence[Envelope], sends: Sequence[Event], now_ms: int) -> None:
        """Facts (and outbox messages) the leader committed."""
        self.appended((e.event.TYPE for e in envs), "facts")
        if sends:
            self.appended((ev.TYPE for ev in sends), "outbox")
        for env in envs:
            ev = env.event
            if type(ev) is UpdateTaskExecutionState:
                self.task_transitions.labels(ev.state._value_).inc()
            elif type(ev) is TaskRestartScheduled:
                self.restarts.inc()
            else:
                key = _answer(ev)
                if key is not None and key in self._asked:
                    self.split_round_trip.observe(max(now_ms - self._asked.pop(key), 0) / 1000)

    def forget(self) -> None:
        """Stepped down: requests read as leader are decided again by the next one."""
        self._asked.clear()


def _request(ev: Event) -> tuple[str, str, int, int] | None:
    if type(ev) is RequestNextInputSplit:
        return ev.job_id, ev.vertex_id, ev.subtask, _attempt(ev.execution_id)
    if type(ev) is OperatorEvent and ev.to_coordinator and isinstance(ev.body, dict) \
            and ev.body.get("type") == REQUEST:
        return ev.job_id, ev.operator_id, ev.subtask, ev.attempt
    return None


def _answer(ev: Event) -> tuple[str, str, int, int] | None:
    if type(ev) is NextInputSplit:
        vertex, subtask, attempt = ev.execution_id.rsplit(":", 2)
        return ev.job_id, vertex, int(subtask), int(attempt)
    if type(ev) is OperatorEvent and not ev.to_coordinator and isinstance(ev.body, dict) \
            and ev.body.get("type") in (SPLIT, NO_MORE):
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
            "sluice_taskmanager_tasks_ended", "Tasks that ended on this TaskManager, by final state.", ["state"],
            registry=self.registry)


class ProjectorMetrics(Metrics):
    def __init__(self) -> None:
        super().__init__()
        self.table_writes = Counter(
            "sluice_projector_table_writes", "Batches of rows the projector wrote to its read-model tables.",
            registry=self.registry)


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


def _gauge(name: str, doc: str, labels: Sequence[str] = (), values: dict[tuple[str, ...], float] | None = None,
           value: float | None = None) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=list(labels) if labels else None, value=value)
    for key, v in (values or {}).items():
        g.add_metric(list(key), v)
    return g


def cluster_families(leading: bool, epoch: int | None, membership: Membership, jobs: JobsState) -> list[Metric]:
    """The leader's view: slots, TaskManagers, tasks by state and jobs by status (the jobs it
    holds in memory: running ones, and ended ones until they are archived)."""
    active = list(membership.active())
    total = sum(r.slots for r in active)
    by_tm = jobs.pool.by_tm
    used = sum(len([s for s in by_tm.get(r.resource_id, ()) if s < r.slots]) for r in active)
    tasks: Tally[str] = Tally()
    statuses: Tally[str] = Tally()
    for job in list(jobs.jobs.values()):
        statuses[job.status._value_] += 1
        for v in list(job.vertices.values()):
            for ex in v.subtasks:
                tasks[ex.state._value_] += 1
    return [
        _gauge("sluice_jobmanager_leading", "1 while this JobManager leads, else 0.", value=int(leading)),
        _gauge("sluice_jobmanager_epoch", "The epoch this JobManager leads at (0: standby).", value=epoch or 0),
        _gauge("sluice_cluster_taskmanagers", "TaskManagers registered with the leader.", value=len(active)),
        _gauge("sluice_cluster_slots", "Slots of registered TaskManagers, free or in use.", ["state"],
               {("free",): total - used, ("in_use",): used}),
        _gauge("sluice_tasks", "Subtasks' current attempts of the jobs the leader holds, by state.", ["state"],
               {(s,): n for s, n in sorted(tasks.items())}),
        _gauge("sluice_jobs", "Jobs the leader holds in memory, by status.", ["status"],
               {(s,): n for s, n in sorted(statuses.items())}),
    ]


def inbox_families(readings: Iterable[InboxReading], kind_of: Callable[[str], str]) -> list[Metric]:
    """Lag and pending entries, summed per kind of inbox (``kind_of(stream)``: cluster, jobs,
    taskmanager), so the series stay few however many jobs come and go."""
    lag: Tally[str] = Tally()
    pending: Tally[str] = Tally()
    for r in readings:
        kind = kind_of(r.stream)
        lag[kind] += r.lag
        pending[kind] += r.pending
    return [
        _gauge("sluice_inbox_lag_entries", "Inbox entries not yet read by this process's consumer group.",
               ["inbox"], {(k,): n for k, n in sorted(lag.items())}),
        _gauge("sluice_inbox_pending_entries", "Inbox entries read and not yet acknowledged.", ["inbox"],
               {(k,): n for k, n in sorted(pending.items())}),
    ]


def dead_letter_family(counts: dict[str, int], kind_of: Callable[[str], str]) -> Metric:
    """Entries held in the dead-letter streams of the tags this process serves."""
    by_kind: Tally[str] = Tally()
    for tag, n in counts.items():
        by_kind[kind_of(tag)] += n
    return _gauge("sluice_dead_letter_entries", "Entries in the dead-letter streams of the tags this process "
                  "reads (parked: undecodable, refused, undeliverable).", ["scope"],
                  {(k,): n for k, n in sorted(by_kind.items())})


def taskmanager_families(registered: bool, slots: int, held: Iterable[str]) -> list[Metric]:
    """A TaskManager's own view: its slots and the tasks it holds (``held``: their states)."""
    tasks = Tally(held)
    used = sum(tasks.values())
    return [
        _gauge("sluice_taskmanager_registered", "1 while registered with a leader, else 0.", value=int(registered)),
        _gauge("sluice_taskmanager_slots", "This TaskManager's slots, free or in use.", ["state"],
               {("free",): max(slots - used, 0), ("in_use",): used}),
        _gauge("sluice_taskmanager_tasks", "Tasks this TaskManager holds, by state.", ["state"],
               {(s,): n for s, n in sorted(tasks.items())}),
    ]


def jobmanager_gauges(jm: JobManager) -> list[Metric]:
    """Everything a JobManager's endpoint computes when scraped."""
    from sluice.store import tag_of
    from sluice.store.metrics_reads import dead_letter_counts, inbox_readings

    state = jm.state  # replaced whole when it steps down: read once
    out = cluster_families(jm.leading, jm.epoch, state.membership, state.jobs)
    streams = list(jm.consumer.streams)

    def kind(stream_or_tag: str) -> str:
        return "cluster" if stream_or_tag in (jm.inbox, jm.tag) else "jobs"

    def read() -> list[Metric]:
        tags = list(dict.fromkeys(tag_of(s) for s in streams))
        return [*inbox_families(inbox_readings(jm.log, streams, jm.group), kind),
                dead_letter_family(dead_letter_counts(jm.log, tags), kind)]

    return out + store_families(read, jm.logger)


def taskmanager_gauges(tm: TaskManager) -> list[Metric]:
    """Everything a TaskManager's endpoint computes when scraped."""
    from sluice.store import tag_of
    from sluice.store.metrics_reads import dead_letter_counts, inbox_readings

    held = [r.state._value_ for r in tm.slot_report() if not r.state.terminal]
    out = taskmanager_families(tm.reg.state == "REGISTERED", tm.reg.slots, held)

    def read() -> list[Metric]:
        tag = tag_of(tm.inbox)
        return [*inbox_families(inbox_readings(tm.log, [tm.inbox], tm.consumer.group), lambda _: "taskmanager"),
                dead_letter_family(dead_letter_counts(tm.log, [tag]), lambda _: "taskmanager")]

    return out + store_families(read, tm.logger)


def projector_gauges(p: Projector) -> list[Metric]:
    """Everything the projector's endpoint computes when scraped."""
    tables: Tally[str] = Tally(r.projection.name for r in list(p.running))
    return [_gauge("sluice_projector_tables", "Read-model tables the projector keeps, by projection.", ["projection"],
                   {(name,): n for name, n in sorted(tables.items())})]


def store_families(read: Callable[[], list[Metric]], logger: Any) -> list[Metric]:
    """``read()``'s families, or none when Redis does not answer (the scrape still serves the
    process's own metrics; the loop says Redis is away)."""
    try:
        return read()
    except SluiceError as exc:
        logger.debug("metrics: Redis readings skipped", error=str(exc)[:200])
        return []


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
        raise ConfigError(f"metrics port {port} is not a TCP port: give {option} a port from 1 to 65535, "
                          "or 0 to serve no metrics")
    try:
        server, thread = start_http_server(port, addr=host, registry=metrics.registry)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(f"metrics port {port} on {host} is already in use by another process: give {option} "
                              "a free port, or 0 to serve no metrics") from exc
        if exc.errno == errno.EACCES:
            raise ConfigError(f"metrics port {port} on {host} needs privileges this process lacks: give {option} "
                              "a port above 1023, or 0 to serve no metrics") from exc
        raise ConfigError(f"cannot serve metrics on {host}:{port} ({exc}): check the metrics host, give {option} "
                          "another port, or 0 to serve no metrics") from exc
    shown = hostname() if host in ("", "0.0.0.0", "::") else host
    shown = f"[{shown}]" if ":" in shown else shown
    return Endpoint(server, thread, f"http://{shown}:{server.server_address[1]}/metrics")
