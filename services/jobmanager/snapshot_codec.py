"""Snapshots of the leader's state, as data: encode and decode, exactly (no I/O; the writer and
the loading are in services/jobmanager/snapshot.py).

Two kinds, one per hash tag, each stored with the fact entry id it covers (store/snapshots.py):

* a **job** snapshot: that job's ``JobRun`` (ExecutionGraph, slots, queryable state, the
  scheduler's ready queue and the subtasks' stories), the slots it holds in the pool, and
  its coordinators' last checkpoints with the facts fed to them since;
* the **cluster** snapshot: membership, every job ever registered (in order), the last
  leadership grant, the jobs that ended and left the replay (``archived``), and the jobs
  purged (``purged``; absent from snapshots written before purging existed).

Serialized with orjson; events inside (the job's submission, coordinator tails, the grant)
are stored as encoded envelopes, so their own schema versions and upcasters apply. A
snapshot carries :data:`VERSION`; one that does not decode, has another version or does not
fit raises :class:`SnapshotUnreadable` (the caller replays the log in full instead).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson

from sluice.errors import SnapshotUnreadable
from sluice.events import Envelope, Event, JobEdge, JobStatus, JobSubmitted, LeadershipGranted, TaskState
from sluice.events import decode_bytes as decode_envelope
from sluice.events import encode as encode_envelope
from sluice.services.jobs.state import Execution, JobRun, JobsState, VertexRun
from sluice.services.kvstate.registry import KvStateEntry, KvStateLocation, KvStateRegistry
from sluice.services.membership.core import Membership, TaskManagerRow

__all__ = [
    "VERSION",
    "Checkpoint",
    "SnapshotUnreadable",
    "JobSnapshot",
    "ClusterSnapshot",
    "encode_job",
    "decode_job",
    "encode_cluster",
    "decode_cluster",
    "job_snapshot",
    "install_job",
]

VERSION = 1
"""The snapshot schema version; a snapshot of another version is not read (full replay)."""

Checkpoint = tuple[int, Any, "list[int] | None"]
"""A coordinator's last checkpoint: (checkpoint id, state, each subtask's attempt then)."""

_T = TypeVar("_T")


@dataclass
class JobSnapshot:
    job_id: str
    run: JobRun | None
    pool: list[tuple[str, int, str]] = field(default_factory=list)
    """(taskmanager, slot, execution id) the job holds in the slot pool."""
    checkpoints: dict[str, Checkpoint] = field(default_factory=dict)
    tails: dict[str, list[Event]] = field(default_factory=dict)


@dataclass
class ClusterSnapshot:
    membership: Membership
    registered: list[str]
    last_grant: LeadershipGranted | None
    archived: list[str]
    purged: list[str] = field(default_factory=list)
    """Registered jobs purged (``JobPurged``): in no replay, their ids taken."""


# --- events inside a snapshot ------------------------------------------------------------------


def _ev(ev: Event) -> str:
    return encode_envelope(Envelope(ev, "snapshot")).decode()


def _unev(raw: str) -> Event:
    return decode_envelope(raw).event


# --- jobs --------------------------------------------------------------------------------------


def _execution(ex: Execution) -> list[Any]:
    return [
        ex.attempt,
        ex.state.value,
        ex.taskmanager,
        ex.slot,
        ex.error,
        ex.since,
        ex.not_before,
        ex.produced,
        ex.seq,
        ex.session,
        ex.history,
        ex.placed_epoch,
    ]


def _unexecution(vertex: str, subtask: int, d: list[Any]) -> Execution:
    attempt, state, tm, slot, error, since, not_before, produced, seq, session, history = d[:11]
    placed = d[11] if len(d) > 11 else None  # (snapshots written before the placement's epoch was kept)
    return Execution(
        vertex,
        subtask,
        attempt,
        TaskState(state),
        tm,
        slot,
        error,
        since,
        not_before,
        produced,
        seq,
        session,
        [(int(t), str(w)) for t, w in history],
        placed,
    )


def _kvstate(reg: KvStateRegistry) -> dict[str, Any]:
    return {
        "job_id": reg.job_id,
        "num_key_groups": reg.num_key_groups,
        "disposed": reg.disposed,
        "state_ids": sorted(reg.state_ids),
        "locations": [
            [
                loc.job_id,
                loc.name,
                loc.vertex,
                loc.num_key_groups,
                [[e.start, e.end, e.state_id, e.address, e.execution_id] for e in loc.entries.values()],
            ]
            for loc in reg.locations.values()
        ],
    }


def _unkvstate(d: dict[str, Any]) -> KvStateRegistry:
    reg = KvStateRegistry(d["job_id"], d["num_key_groups"], disposed=d["disposed"], state_ids=set(d["state_ids"]))
    for job_id, name, vertex, nkg, entries in d["locations"]:
        loc = KvStateLocation(job_id, name, vertex, nkg)
        for start, end, state_id, address, eid in entries:
            loc.entries[(start, end)] = KvStateEntry(start, end, state_id, address, eid)
        reg.locations[name] = loc
    return reg


def _run(job: JobRun) -> dict[str, Any]:
    submitted = JobSubmitted(
        job.job_id, job.graph, job.code_blob, job.module, job.reply_to, job.params, job.splits, job.storage_root
    )
    return {
        "submitted": _ev(submitted),
        "submitted_at": job.submitted_at,
        "status": job.status.value,
        "reason": job.reason,
        "restarts": job.restarts,
        "waiting_since": job.waiting_since,
        "wait_until_placed": job.wait_until_placed,
        "slot_taken_at": job.slot_taken_at,
        "built": job.built,
        "ended_at": job.ended_at,
        "floor": job.floor,
        "history": job.history,
        "vertices": [
            [name, v.produced, v.finished, v.started, [_execution(ex) for ex in v.subtasks], *_speculation(v)]
            for name, v in job.vertices.items()
        ],
        "ready": [r for ex in job.ready if (r := _ready(job, ex)) is not None],
        "kvstate": _kvstate(job.kvstate),
    }


def _speculation(v: VertexRun) -> list[dict[str, Any]]:
    """A vertex's speculative execution (services/jobs/speculation.py), when it had any: its
    attempts beside the current ones and the highest attempt each subtask was given (nothing
    otherwise: a snapshot of a job without speculation is as it always was)."""
    if not v.highest:
        return []
    return [
        {
            "concurrent": [[i, [_execution(ex) for ex in others]] for i, others in v.concurrent.items()],
            "highest": [[i, a] for i, a in v.highest.items()],
        }
    ]


def _unspeculation(v: VertexRun, name: str, d: dict[str, Any]) -> None:
    v.concurrent = {int(i): [_unexecution(name, int(i), ex) for ex in others] for i, others in d["concurrent"]}
    v.highest = {int(i): int(a) for i, a in d["highest"]}


def _ready(job: JobRun, ex: Execution) -> list[Any] | None:
    """A ready execution: [vertex, subtask], and its attempt when it runs beside the current
    one (None: a speculative attempt that has ended since, no longer anywhere)."""
    vertex = job.vertices[ex.vertex]
    if vertex.subtasks[ex.subtask] is ex:
        return [ex.vertex, ex.subtask]
    if ex in vertex.concurrent.get(ex.subtask, ()):
        return [ex.vertex, ex.subtask, ex.attempt]
    return None


def _unready(job: JobRun, r: list[Any]) -> Execution:
    vertex = job.vertices[str(r[0])]
    subtask = int(r[1])
    if len(r) == 2:
        return vertex.subtasks[subtask]
    return next(ex for ex in vertex.concurrent[subtask] if ex.attempt == int(r[2]))


def _unrun(d: dict[str, Any]) -> JobRun:
    sub = _unev(d["submitted"])
    if not isinstance(sub, JobSubmitted):
        raise SnapshotUnreadable(f"a job snapshot's submission is a {sub.TYPE}")
    job = JobRun(
        sub.job_id,
        sub.graph,
        sub.code_blob,
        sub.module,
        sub.reply_to,
        sub.params,
        sub.splits,
        sub.storage_root,
        d["submitted_at"],
    )
    job.status, job.reason, job.restarts = JobStatus(d["status"]), d["reason"], d["restarts"]
    job.waiting_since, job.built, job.ended_at, job.floor = d["waiting_since"], d["built"], d["ended_at"], d["floor"]
    # (a snapshot older than JobWaitingForSlots v2 holds a wait that ends at a slot taken)
    job.wait_until_placed, job.slot_taken_at = d.get("wait_until_placed", False), d.get("slot_taken_at")
    job.history = [(int(t), str(w)) for t, w in d["history"]]
    specs = {v.name: v for v in sub.graph.vertices}
    inputs: dict[str, list[JobEdge]] = {v.name: [] for v in sub.graph.vertices}
    outputs: dict[str, list[JobEdge]] = {v.name: [] for v in sub.graph.vertices}
    for e in sub.graph.edges:  # wired as services/jobs/state.py _build wires them
        inputs[e.target].append(e)
        outputs[e.source].append(e)
    for name, produced, finished, started, subtasks, *speculation in d["vertices"]:
        execs = [_unexecution(name, i, ex) for i, ex in enumerate(subtasks)]
        job.vertices[name] = v = VertexRun(specs[name], inputs[name], outputs[name], execs, produced, finished, started)
        if speculation:
            _unspeculation(v, name, speculation[0])
    job.ready = deque(_unready(job, r) for r in d["ready"])
    job.kvstate = _unkvstate(d["kvstate"])
    return job


def job_snapshot(
    state: JobsState,
    job_id: str,
    checkpoints: dict[str, Checkpoint] | None = None,
    tails: dict[str, list[Event]] | None = None,
) -> JobSnapshot:
    """What a snapshot of ``job_id`` holds, taken from a JobsState."""
    pool = state.pool.held_by(job_id)
    return JobSnapshot(
        job_id,
        state.jobs.get(job_id),
        pool,
        dict(checkpoints or {}),
        {op: list(evs) for op, evs in (tails or {}).items()},
    )


def install_job(state: JobsState, snap: JobSnapshot) -> None:
    """Put a decoded job snapshot into ``state`` (its run, and the slots it holds)."""
    if snap.run is not None:
        state.jobs[snap.job_id] = snap.run
    for tm, slot, eid in snap.pool:
        state.pool.take(tm, slot, snap.job_id, eid)


def encode_job(snap: JobSnapshot) -> bytes:
    return orjson.dumps(
        {
            "v": VERSION,
            "kind": "job",
            "job_id": snap.job_id,
            "run": _run(snap.run) if snap.run is not None else None,
            "pool": [list(p) for p in snap.pool],
            "checkpoints": {op: [cid, cstate, attempts] for op, (cid, cstate, attempts) in snap.checkpoints.items()},
            "tails": {op: [_ev(ev) for ev in evs] for op, evs in snap.tails.items()},
        }
    )


def decode_job(data: bytes, job_id: str | None = None) -> JobSnapshot:
    def build(d: dict[str, Any]) -> JobSnapshot:
        if job_id is not None and d["job_id"] != job_id:
            raise SnapshotUnreadable(f"the snapshot is of job {d['job_id']!r}, not {job_id!r}")
        return JobSnapshot(
            d["job_id"],
            _unrun(d["run"]) if d["run"] is not None else None,
            [(str(tm), int(slot), str(eid)) for tm, slot, eid in d["pool"]],
            {
                op: (int(cid), cstate, list(attempts) if attempts is not None else None)
                for op, (cid, cstate, attempts) in d["checkpoints"].items()
            },
            {op: [_unev(raw) for raw in evs] for op, evs in d["tails"].items()},
        )

    return _decode(data, "job", build)


# --- the cluster -------------------------------------------------------------------------------


def _membership(m: Membership) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(m):
        value = getattr(m, f.name)
        out[f.name] = [row.to_dict() for row in value.values()] if f.name == "taskmanagers" else value
    return out


def _unmembership(d: dict[str, Any]) -> Membership:
    d = dict(d)
    rows = [TaskManagerRow.from_dict(r) for r in d.pop("taskmanagers")]
    if "restarted" not in d and d.get("attempt_floor"):  # (a snapshot from before restarts were per shard)
        d["restarted"] = [[0, 16383, d["attempt_floor"]]]
    return Membership(taskmanagers={r.resource_id: r for r in rows}, **d)


def encode_cluster(snap: ClusterSnapshot) -> bytes:
    return orjson.dumps(
        {
            "v": VERSION,
            "kind": "cluster",
            "membership": _membership(snap.membership),
            "registered": snap.registered,
            "archived": snap.archived,
            "purged": snap.purged,
            "last_grant": _ev(snap.last_grant) if snap.last_grant is not None else None,
        }
    )


def decode_cluster(data: bytes) -> ClusterSnapshot:
    def build(d: dict[str, Any]) -> ClusterSnapshot:
        grant = _unev(d["last_grant"]) if d["last_grant"] is not None else None
        if grant is not None and not isinstance(grant, LeadershipGranted):
            raise SnapshotUnreadable(f"the cluster snapshot's last grant is a {grant.TYPE}")
        return ClusterSnapshot(
            _unmembership(d["membership"]),
            [str(j) for j in d["registered"]],
            grant,
            [str(j) for j in d["archived"]],
            [str(j) for j in d.get("purged", [])],
        )

    return _decode(data, "cluster", build)


def _decode(data: bytes, kind: str, build: Callable[[dict[str, Any]], _T]) -> _T:
    try:
        d = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise SnapshotUnreadable(f"not JSON: {exc}") from None
    if type(d) is not dict or d.get("kind") != kind:
        raise SnapshotUnreadable(f"not a {kind} snapshot")
    if d.get("v") != VERSION:
        raise SnapshotUnreadable(f"schema version {d.get('v')!r}, this Sluice reads version {VERSION}")
    try:
        return build(d)
    except SnapshotUnreadable:
        raise
    except Exception as exc:  # a field missing, of the wrong type, an event that does not decode
        raise SnapshotUnreadable(f"{type(exc).__name__}: {exc}"[:300]) from None
