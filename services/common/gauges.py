"""The gauges of the metrics endpoints (services/common/metrics.py), computed when scraped:
from what a process holds in memory (pure functions of its state, tested without Redis)
and, through ``store/metrics_reads.py``, from Redis (inbox lag and pending entries,
dead-letter streams; one pipelined round trip). The process's loop pays nothing for them."""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client.core import GaugeMetricFamily, Metric

from sluice.errors import SluiceError
from sluice.events import AttemptReport

if TYPE_CHECKING:
    from sluice.services.jobmanager.state import LeaderState
    from sluice.services.jobs.state import JobsState
    from sluice.services.membership.core import Membership
    from sluice.services.projector.process import Projector
    from sluice.store import EventLog
    from sluice.store.metrics_reads import InboxReading

__all__ = [
    "cluster_families",
    "inbox_families",
    "dead_letter_family",
    "taskmanager_families",
    "store_families",
    "jobmanager_gauges",
    "taskmanager_gauges",
    "projector_gauges",
]


def _gauge(
    name: str,
    doc: str,
    labels: Sequence[str] = (),
    values: dict[tuple[str, ...], float] | None = None,
    value: float | None = None,
) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=list(labels) if labels else None, value=value)
    for key, v in (values or {}).items():
        g.add_metric(list(key), v)
    return g


def cluster_families(leading: bool, epoch: int | None, membership: Membership, jobs: JobsState) -> list[Metric]:
    """The leader's view: slots, TaskManagers, tasks by state and jobs by status (the jobs it
    holds in memory: running ones, and ended ones until they are archived)."""
    active = list(membership.active())
    total = sum(r.slots for r in active)
    by_taskmanager = jobs.pool.by_taskmanager
    used = sum(len([s for s in by_taskmanager.get(r.resource_id, ()) if s < r.slots]) for r in active)
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
        _gauge(
            "sluice_cluster_slots",
            "Slots of registered TaskManagers, free or in use.",
            ["state"],
            {("free",): total - used, ("in_use",): used},
        ),
        _gauge(
            "sluice_tasks",
            "Subtasks' current attempts of the jobs the leader holds, by state.",
            ["state"],
            {(s,): n for s, n in sorted(tasks.items())},
        ),
        _gauge(
            "sluice_jobs",
            "Jobs the leader holds in memory, by status.",
            ["status"],
            {(s,): n for s, n in sorted(statuses.items())},
        ),
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
        _gauge(
            "sluice_inbox_lag_entries",
            "Inbox entries not yet read by this process's consumer group.",
            ["inbox"],
            {(k,): n for k, n in sorted(lag.items())},
        ),
        _gauge(
            "sluice_inbox_pending_entries",
            "Inbox entries read and not yet acknowledged.",
            ["inbox"],
            {(k,): n for k, n in sorted(pending.items())},
        ),
    ]


def dead_letter_family(counts: dict[str, int], kind_of: Callable[[str], str]) -> Metric:
    """Entries held in the dead-letter streams of the tags this process serves."""
    by_kind: Tally[str] = Tally()
    for tag, n in counts.items():
        by_kind[kind_of(tag)] += n
    return _gauge(
        "sluice_dead_letter_entries",
        "Entries in the dead-letter streams of the tags this process "
        "reads (parked: undecodable, refused, undeliverable).",
        ["scope"],
        {(k,): n for k, n in sorted(by_kind.items())},
    )


def taskmanager_families(registered: bool, slots: int, held: Iterable[str]) -> list[Metric]:
    """A TaskManager's own view: its slots and the tasks it holds (``held``: their states)."""
    tasks = Tally(held)
    used = sum(tasks.values())
    return [
        _gauge("sluice_taskmanager_registered", "1 while registered with a leader, else 0.", value=int(registered)),
        _gauge(
            "sluice_taskmanager_slots",
            "This TaskManager's slots, free or in use.",
            ["state"],
            {("free",): max(slots - used, 0), ("in_use",): used},
        ),
        _gauge(
            "sluice_taskmanager_tasks",
            "Tasks this TaskManager holds, by state.",
            ["state"],
            {(s,): n for s, n in sorted(tasks.items())},
        ),
    ]


def jobmanager_gauges(
    *,
    leading: bool,
    epoch: int | None,
    state: LeaderState,
    recovering: int,
    streams: list[str],
    cluster: tuple[str, str],
    log: EventLog,
    group: str,
    logger: Any,
) -> list[Metric]:
    """Everything a JobManager's endpoint computes when scraped: from its leadership, its
    state (read once: it is replaced whole when it steps down), how many jobs it is still
    recovering, the streams it reads (``cluster``: the cluster's inbox and tag) and, through
    the log, what Redis holds for them."""
    from sluice.store import tag_of
    from sluice.store.metrics_reads import dead_letter_counts, inbox_readings

    out = cluster_families(leading, epoch, state.membership, state.jobs)
    out.append(
        _gauge(
            "sluice_jobs_recovering",
            "Live jobs a leader that already serves is still rebuilding from the log.",
            value=recovering,
        )
    )

    def kind(stream_or_tag: str) -> str:
        return "cluster" if stream_or_tag in cluster else "jobs"

    def read() -> list[Metric]:
        tags = list(dict.fromkeys(tag_of(s) for s in streams))
        return [
            *inbox_families(inbox_readings(log, streams, group), kind),
            dead_letter_family(dead_letter_counts(log, tags), kind),
        ]

    return out + store_families(read, logger)


def taskmanager_gauges(
    log: EventLog, inbox: str, group: str, logger: Any, *, registered: bool, slots: int, held: Iterable[AttemptReport]
) -> list[Metric]:
    """Everything a TaskManager's endpoint computes when scraped: its registration and slots,
    ``held`` (its slot report) and its inbox (the stream ``inbox``, read by ``group``)."""
    from sluice.store import tag_of
    from sluice.store.metrics_reads import dead_letter_counts, inbox_readings

    out = taskmanager_families(registered, slots, [r.state._value_ for r in held if not r.state.terminal])

    def read() -> list[Metric]:
        tag = tag_of(inbox)
        return [
            *inbox_families(inbox_readings(log, [inbox], group), lambda _: "taskmanager"),
            dead_letter_family(dead_letter_counts(log, [tag]), lambda _: "taskmanager"),
        ]

    return out + store_families(read, logger)


def projector_gauges(p: Projector) -> list[Metric]:
    """Everything the projector's endpoint computes when scraped."""
    tables: Tally[str] = Tally(r.projection.name for r in list(p.running))
    return [
        _gauge(
            "sluice_projector_tables",
            "Read-model tables the projector keeps, by projection.",
            ["projection"],
            {(name,): n for name, n in sorted(tables.items())},
        )
    ]


def store_families(read: Callable[[], list[Metric]], logger: Any) -> list[Metric]:
    """``read()``'s families, or none when Redis does not answer or answers something unexpected
    (the scrape still serves the process's own metrics: a monitoring read never fails it)."""
    try:
        return read()
    except SluiceError as exc:  # Redis away: the loop says so in the log
        logger.debug("metrics: Redis readings skipped", error=str(exc)[:200])
    except Exception as exc:
        logger.warning("metrics: Redis readings failed", error=f"{type(exc).__name__}: {exc}"[:300])
    return []
