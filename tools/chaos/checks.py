"""What every run checks once its jobs ended: the tables are a replay of the log, no
fact went back in epoch, a frozen leader that woke up was refused, nothing leaked."""

from __future__ import annotations

import time
from pathlib import Path

from sluice.events import JobRegistered, TaskState, UpdateTaskExecutionState
from sluice.services.projector.core import EXECUTION_GRAPH, JOB_PROJECTIONS, PROJECTIONS, Projection, expand
from sluice.store import EventLog, ReadModels, entry_order

__all__ = ["finished_at", "tables_differ", "epochs_go_back", "refusal", "REFUSALS", "job_ids"]

REFUSALS = ("deposed", "lost the lease", "StaleEpoch")
"""What a JobManager's log says when it learns it no longer leads (services/jobmanager/process.py):
a commit refused by the fence (``deposed``, from StaleEpoch), or its lease gone on renewal."""


def job_ids(log: EventLog) -> list[str]:
    return [
        env.event.job_id
        for _, env in log.replay(log.keys.facts(log.keys.cluster))
        if isinstance(env.event, JobRegistered)
    ]


def finished_at(log: EventLog) -> list[int]:
    """When (server ms, from the entry ids) every task FINISHED, in every job, sorted."""
    out = []
    for job_id in job_ids(log):
        for entry_id, env in log.replay(log.keys.facts(log.keys.job(job_id))):
            if isinstance(env.event, UpdateTaskExecutionState) and env.event.state == TaskState.FINISHED:
                out.append(int(entry_id.split("-")[0]))
    return sorted(out)


def _replayed(log: EventLog, tag: str, projection: Projection, upto: str | None) -> dict[str, dict]:
    """The rows of ``projection`` as a fresh fold of the tag's facts up to ``upto`` gives them,
    with the projection's own ``evolve``."""
    state = projection.initial()
    touched: set[str] = set()
    if upto is not None:
        for entry_id, env in log.replay(log.keys.facts(tag)):
            if entry_order(entry_id) > entry_order(upto):
                break
            projection.evolve(state, env)  # in place, as the projector folds
            touched.update(projection.touched(env))
    if projection is EXECUTION_GRAPH:
        touched = expand(state, touched)
    return {k: row for k in touched if (row := projection.row(state, k)) is not None}


def _diff(name: str, live: dict, replay: dict) -> list[str]:
    out = []
    for k in sorted(set(live) | set(replay), key=str):
        if live.get(k) != replay.get(k):
            out.append(f"table {name}, row {k}: live {str(live.get(k))[:300]} / replay {str(replay.get(k))[:300]}")
    return out


def tables_differ(log: EventLog, *, settle_s: float = 30.0) -> list[str]:
    """Every read-model table the projector wrote in Redis against a fresh fold of its fact
    stream up to the position stored with the table (read with it, atomically); first waits
    (up to ``settle_s``) for the projector to reach the end of every stream."""
    tables = ReadModels(log)
    keys = log.keys
    targets = [(keys.cluster, p) for p in PROJECTIONS] + [
        (keys.job(j), p) for j in job_ids(log) for p in JOB_PROJECTIONS
    ]
    deadline = time.monotonic() + settle_s
    while time.monotonic() < deadline:
        behind = [(t, p.name) for t, p in targets if tables.read(t, p.name)[0] != log.last_id(keys.facts(t))]
        if not behind:
            break
        time.sleep(0.2)
    problems = []
    for tag, projection in targets:
        position, rows = tables.read(tag, projection.name)
        last = log.last_id(keys.facts(tag))
        if position != last:
            problems.append(f"table {projection.name} of {tag} stays at {position}, the log at {last}")
        problems += _diff(f"{projection.name} of {tag}", rows, _replayed(log, tag, projection, position))
    return problems


def epochs_go_back(log: EventLog) -> list[str]:
    """Facts committed below an epoch already seen in the same stream: a stale leader wrote."""
    keys = log.keys
    problems = []
    for tag in [keys.cluster] + [keys.job(j) for j in job_ids(log)]:
        top, at = 0, None
        for entry_id, env in log.replay(keys.facts(tag)):
            if env.epoch < top:
                problems.append(
                    f"{env.type} at epoch {env.epoch} in {keys.facts(tag)} {entry_id}, after epoch {top} at {at}"
                )
            elif env.epoch > top:
                top, at = env.epoch, entry_id
    return problems


def refusal(log_file: Path, offset: int, markers: tuple[str, ...] = REFUSALS) -> str | None:
    """The first line after ``offset`` of a JobManager's log that says it was refused or
    stepped down (None: none yet); with ``markers``, a line that says any of those."""
    try:
        with log_file.open("rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if any(r in line for r in markers):
            return line.strip()
    return None
