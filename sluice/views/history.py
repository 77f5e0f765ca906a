"""Time travel: the cluster's and a job's tables as they were at any entry of the log.

Every table is a fold of a fact stream (services/projector/core.py names the folds), and
facts are never trimmed, so the state at a moment is the same fold stopped at that
moment's entry. ``at`` is an entry id (``1763870000000-3``), a time in milliseconds since
the epoch, or an ISO 8601 time (UTC unless it says otherwise); ``None`` means now.

Nothing here writes: the folds run in memory on the projections' own ``evolve``, so a
table rebuilt here is the table the projector keeps (``tables`` renders it row by row,
in the projector's row format, which is what ``sluice replay --check`` compares).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sluice.errors import BadMoment, SluiceError
from sluice.events import Envelope
from sluice.services.jobs.state import JobRun, JobsState
from sluice.services.kvstate.registry import KvStateRegistry
from sluice.services.membership.core import Membership
from sluice.services.projector.core import (
    EXECUTION_GRAPH,
    JOBS,
    KVSTATE,
    LEADERSHIP,
    TASKMANAGERS,
    Projection,
    expand,
)
from sluice.store import EventLog, entry_order

__all__ = ["Moment", "resolve_at", "facts_until", "cluster_at", "job_at", "ClusterAt", "JobAt", "tables", "BadMoment"]

_ENTRY = re.compile(r"^\d+-\d+$")
_LAST_SEQ = 2**64 - 1


@dataclass(frozen=True)
class Moment:
    """A point of the log: every entry at or before ``entry`` counts (None: everything)."""

    entry: str | None
    said: str | None = None
    """What the user wrote, for messages."""

    def includes(self, entry_id: str) -> bool:
        return self.entry is None or entry_order(entry_id) <= entry_order(self.entry)

    @property
    def ms(self) -> int | None:
        return entry_order(self.entry)[0] if self.entry is not None else None


def resolve_at(spec: str | int | None) -> Moment:
    """``--at``'s value as a Moment. Raises BadMoment naming the forms it accepts."""
    if spec is None or spec == "" or spec == "now":
        return Moment(None, None if spec is None else str(spec))
    text = str(spec).strip()
    if _ENTRY.match(text):
        return Moment(text, text)
    if text.isdigit():
        return Moment(f"{int(text)}-{_LAST_SEQ}", text)
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise BadMoment(
            f"--at {text!r} is neither an entry id (like 1763870000000-0), a time in milliseconds "
            "since the epoch, nor an ISO 8601 time (like 2026-11-23T05:30:00Z)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return Moment(f"{int(when.timestamp() * 1000)}-{_LAST_SEQ}", text)


def facts_until(log: EventLog, stream: str, at: Moment) -> Iterator[tuple[str, Envelope]]:
    """The facts of ``stream`` up to the moment, in order."""
    for entry_id, env in log.replay(stream):
        if not at.includes(entry_id):
            return
        yield entry_id, env


@dataclass
class ClusterAt:
    """The cluster's tables at a moment: TaskManagers, the leader, the registered jobs."""

    membership: Membership = field(default_factory=Membership)
    leader: Membership = field(default_factory=Membership)
    jobs: dict[str, dict] = field(default_factory=dict)
    last_entry: str | None = None
    facts: int = 0


@dataclass
class JobAt:
    """One job at a moment: its ExecutionGraph (None before the job was registered) and
    its KvStateLocation table."""

    job_id: str
    graph: JobsState = field(default_factory=JobsState)
    kvstate: KvStateRegistry = field(default_factory=KvStateRegistry)
    last_entry: str | None = None
    facts: int = 0

    @property
    def run(self) -> JobRun | None:
        return self.graph.jobs.get(self.job_id)


def cluster_at(log: EventLog, at: Moment = Moment(None)) -> ClusterAt:
    out = ClusterAt()
    for entry_id, env in facts_until(log, log.keys.facts(log.keys.cluster), at):
        out.membership = TASKMANAGERS.evolve(out.membership, env)
        out.leader = LEADERSHIP.evolve(out.leader, env)
        out.jobs = JOBS.evolve(out.jobs, env)
        out.last_entry, out.facts = entry_id, out.facts + 1
    return out


def job_at(log: EventLog, job_id: str, at: Moment = Moment(None)) -> JobAt:
    """Raises SluiceError if the log has no such job (at all, not only at the moment)."""
    stream = log.keys.facts(log.keys.job(job_id))
    out = JobAt(job_id)
    for entry_id, env in facts_until(log, stream, at):
        out.graph = EXECUTION_GRAPH.evolve(out.graph, env)
        out.kvstate = KVSTATE.evolve(out.kvstate, env)
        out.last_entry, out.facts = entry_id, out.facts + 1
    if out.facts == 0 and log.last_id(stream) is None:
        raise SluiceError(f"job {job_id!r} not found under prefix {log.keys.prefix!r}: `sluice list` shows the jobs")
    return out


def _rows(projection: Projection, state: Any, keys: set[str]) -> dict[str, dict]:
    rows = {}
    for key in sorted(keys):
        row = projection.row(state, key)
        if row is not None:
            rows[key] = row
    return rows


def tables(
    log: EventLog, cluster: ClusterAt | None = None, jobs: Sequence[JobAt] = ()
) -> dict[tuple[str, str], dict[str, dict]]:
    """The tables, as the projector writes them: (tag, table name) -> key -> row, tags as
    ``log.keys`` builds them."""
    out: dict[tuple[str, str], dict[str, dict]] = {}
    if cluster is not None:
        tag = log.keys.cluster
        out[(tag, TASKMANAGERS.name)] = _rows(TASKMANAGERS, cluster.membership, set(cluster.membership.taskmanagers))
        out[(tag, LEADERSHIP.name)] = _rows(LEADERSHIP, cluster.leader, {"leader"})
        out[(tag, JOBS.name)] = _rows(JOBS, cluster.jobs, set(cluster.jobs))
    for j in jobs:
        tag = log.keys.job(j.job_id)
        out[(tag, EXECUTION_GRAPH.name)] = _rows(EXECUTION_GRAPH, j.graph, expand(j.graph, {"job", "*"}))
        out[(tag, KVSTATE.name)] = _rows(KVSTATE, j.kvstate, set(j.kvstate.locations))
    return out
