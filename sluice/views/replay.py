"""``sluice replay``: the cluster's and jobs' tables rebuilt from the log as they were at a
moment, in memory, into a fresh prefix, or checked against the projector's live tables.

A rebuild is history's fold (``sluice.views.history``) rendered row by row as the projector
writes them. Written ``into`` a prefix, it is a small log of its own: the fact streams up to
the moment (entry ids kept) and the tables with the position they reflect, so every
command pointed at that prefix (``sluice --prefix P status|inspect ...``, a projector)
sees the cluster as it was then.

``check`` compares each live table with a rebuild at the position stored with that table
(read together with its rows): a projector that lags the log is reported as lag, not as a
difference.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from sluice.services.projector.core import JOB_PROJECTIONS, PROJECTIONS
from sluice.store import EventLog, ReadModels, entry_order
from sluice.store.archive import append_with_ids

from .archive import ensure_free
from .history import ClusterAt, JobAt, Moment, cluster_at, job_at, tables

__all__ = ["Rebuild", "rebuild", "write_into", "TableCheck", "Difference", "Check", "check", "rebuild_json"]

Tables = dict[tuple[str, str], dict[str, dict]]
Fields = dict[bytes, bytes]


@dataclass
class Rebuild:
    at: Moment
    cluster: ClusterAt | None
    jobs: list[JobAt]

    def tables(self, log: EventLog) -> Tables:
        """The rows, keyed by the tags of ``log`` (the source's, or a target prefix's)."""
        return tables(log, self.cluster, self.jobs)


def rebuild(log: EventLog, at: Moment, *, job: str | None = None, cluster: bool = False) -> Rebuild:
    """The tables at ``at``: of one job (``job``), of the cluster (``cluster``), or, with
    neither, of the cluster and every job it had registered by then."""
    if job is not None:
        return Rebuild(at, cluster_at(log, at) if cluster else None, [job_at(log, job, at)])
    state = cluster_at(log, at)
    if cluster:
        return Rebuild(at, state, [])
    return Rebuild(at, state, [job_at(log, j, at) for j in sorted(state.jobs)])


def rebuild_json(log: EventLog, built: Rebuild) -> dict[str, Any]:
    """What ``sluice replay --json`` prints: the moment, then per scope its position (the
    last fact folded), how many facts it folded, and its tables (name -> key -> row)."""
    rows = built.tables(log)
    out: dict[str, Any] = {"at": {"entry": built.at.entry, "said": built.at.said}}
    if built.cluster is not None:
        tag = log.keys.cluster
        out["cluster"] = {
            "position": built.cluster.last_entry,
            "facts": built.cluster.facts,
            "tables": {p.name: rows[(tag, p.name)] for p in PROJECTIONS},
        }
    out["jobs"] = {}
    for j in built.jobs:
        tag = log.keys.job(j.job_id)
        out["jobs"][j.job_id] = {
            "position": j.last_entry,
            "facts": j.facts,
            "tables": {p.name: rows[(tag, p.name)] for p in JOB_PROJECTIONS},
        }
    return out


def write_into(source: EventLog, target: EventLog, built: Rebuild) -> dict[str, int]:
    """Copy the facts up to the moment and write the rebuilt tables under ``target``'s
    prefix (PrefixInUse when it holds any key); the facts copied per stream."""
    ensure_free(target, how=f"pick a fresh prefix for --into (one no cluster uses), e.g. --into {target.keys.prefix}-2")
    copied: dict[str, int] = {}
    scopes: list[tuple[str, str, str | None]] = []  # (source tag, target tag, position)
    if built.cluster is not None:
        scopes.append((source.keys.cluster, target.keys.cluster, built.cluster.last_entry))
    scopes += [(source.keys.job(j.job_id), target.keys.job(j.job_id), j.last_entry) for j in built.jobs]
    for src_tag, dst_tag, position in scopes:
        if position is None:
            continue
        entries = _until(source.replay_raw(source.keys.facts(src_tag)), position)
        copied[target.keys.facts(dst_tag)] = append_with_ids(target, target.keys.facts(dst_tag), entries)
    rows = built.tables(target)
    models = ReadModels(target)
    positions = {dst: pos for _, dst, pos in scopes}
    for (tag, name), table in rows.items():
        position = positions[tag]
        if position is not None:
            models.write(tag, name, expected=None, position=position, rows=table)
    return copied


def _until(entries: Iterator[tuple[str, Fields]], position: str) -> Iterator[tuple[str, Fields]]:
    last = entry_order(position)
    for entry_id, fields in entries:
        if entry_order(entry_id) > last:
            return
        yield entry_id, fields


# --- check ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TableCheck:
    """Where one live table stands: its stored position, the end of its fact stream, and
    how many facts it has not projected yet (its lag)."""

    scope: str
    """``cluster`` or ``job <id>``."""
    table: str
    position: str | None
    log_end: str | None
    lag: int


@dataclass(frozen=True)
class Difference:
    scope: str
    table: str
    key: str
    field: str
    """The field that differs, or ``*`` for a row one side does not have."""
    live: Any
    rebuilt: Any


@dataclass
class Check:
    tables: list[TableCheck] = field(default_factory=list)
    differences: list[Difference] = field(default_factory=list)

    @property
    def agree(self) -> bool:
        return not self.differences

    def to_json(self) -> dict[str, Any]:
        return {
            "agree": self.agree,
            "tables": [vars(t) for t in self.tables],
            "differences": [vars(d) for d in self.differences],
        }


def check(log: EventLog, *, job: str | None = None, cluster: bool = False) -> Check:
    """Every live table (of one job, of the cluster, or with neither of both and every
    registered job) against a rebuild at the position stored with it."""
    keys = log.keys
    out = Check()
    scopes: list[tuple[str, str, Sequence[Any]]] = []
    if job is None or cluster:
        scopes.append(("cluster", keys.cluster, PROJECTIONS))
    if job is not None:
        job_at(log, job, Moment("0-0"))  # (folds nothing: says so when the log never had the job)
        job_ids = [job]
    else:
        job_ids = [] if cluster else sorted(cluster_at(log).jobs)
    scopes += [(f"job {j}", keys.job(j), JOB_PROJECTIONS) for j in job_ids]
    models = ReadModels(log)
    folded: dict[tuple[str, str], Tables] = {}
    for scope, tag, projections in scopes:
        stream = keys.facts(tag)
        end = log.last_id(stream)
        for projection in projections:
            position, live = models.read(tag, projection.name)
            lag = 0 if position == end else _count_after(log, stream, position)
            out.tables.append(TableCheck(scope, projection.name, position, end, lag))
            rebuilt = _rebuilt(log, folded, scope, tag, position).get((tag, projection.name), {})
            out.differences += _differences(scope, projection.name, live, rebuilt)
    return out


def _rebuilt(
    log: EventLog, folded: dict[tuple[str, str], Tables], scope: str, tag: str, position: str | None
) -> Tables:
    """The scope's tables folded up to ``position`` (None: no fact yet, so no row), one fold
    per (tag, position) however many tables stand there."""
    if position is None:
        return {}
    key = (tag, position)
    if key not in folded:
        at = Moment(position)
        if scope == "cluster":
            folded[key] = tables(log, cluster_at(log, at))
        else:
            folded[key] = tables(log, jobs=[job_at(log, scope.removeprefix("job "), at)])
    return folded[key]


def _count_after(log: EventLog, stream: str, position: str | None) -> int:
    return sum(1 for _ in log.replay_raw(stream, position or "0-0"))


def _differences(scope: str, table: str, live: dict[str, Any], rebuilt: dict[str, Any]) -> list[Difference]:
    out = []
    for key in sorted(set(live) | set(rebuilt)):
        a, b = live.get(key), rebuilt.get(key)
        if a == b:
            continue
        if not isinstance(a, dict) or not isinstance(b, dict):
            out.append(Difference(scope, table, key, "*", a, b))
            continue
        out += [
            Difference(scope, table, key, f, a.get(f), b.get(f))
            for f in sorted(set(a) | set(b))
            if a.get(f) != b.get(f)
        ]
    return out
