"""The TaskManagers at a moment, with their slots and last heartbeats (the dashboard's
TaskManagers page).

A row (JSON)::

    {"resource_id", "host", "session", "state", "registered_at", "since", "reason", "labels",
     "slots_total", "slots_in_use", "slots_free",
     "slots": [{"slot", "job_id", "execution_id"}],      # the slots held, by whom
     "last_heartbeat", "last_heartbeat_entry"}

``state`` is REGISTERED, LOST or UNREGISTERED (departed TaskManagers keep their row);
``registered_at`` is when its current registration was recorded, ``since`` when its state
last changed. Slots in use are the ones the attempts of the jobs hold at the moment
(folded from every registered job's facts; now, read from a job's projected ExecutionGraph
when it is up to date); a departed TaskManager has none free. The last
heartbeat is the newest ``TaskManagerHeartbeat`` of its current session in the cluster
inbox at or before the moment (Redis's time of the entry; None when the inbox no longer
holds one: inboxes are trimmed once read).
"""

from __future__ import annotations

from sluice.errors import DecodeError
from sluice.events import TaskManagerHeartbeat, TaskManagerRegistered, decode_fields
from sluice.services.jobs.state import HOLDS_SLOT
from sluice.services.projector.core import EXECUTION_GRAPH
from sluice.store import EventLog, ReadModels, entry_order
from sluice.store.inspection import entries_before

from .history import Moment, cluster_at, facts_until, job_at

__all__ = ["taskmanagers", "HEARTBEATS_SEARCHED"]

_HOLDS = frozenset(s.value for s in HOLDS_SLOT)

HEARTBEATS_SEARCHED = 5000
"""How many cluster inbox entries, newest first, are searched for the last heartbeats."""


def taskmanagers(log: EventLog, at: Moment = Moment(None)) -> list[dict]:
    cluster = cluster_at(log, at)
    rows = cluster.membership.taskmanagers
    held: dict[str, list[dict]] = {rid: [] for rid in rows}
    for job_id in cluster.jobs:
        if log.last_id(log.keys.facts(log.keys.job(job_id))) is None:
            continue
        holders = _held_now(log, job_id) if at.entry is None else None
        if holders is None:
            holders = job_at(log, job_id, at).graph.pool.holders()
        for tm, slot, job, eid in holders:
            if tm in held:
                held[tm].append({"slot": slot, "job_id": job, "execution_id": eid})
    beats = _last_heartbeats(log, at, {rid: r.session for rid, r in rows.items() if r.status == "REGISTERED"})
    registrations = _registrations(log, at) if any(r.status != "REGISTERED" for r in rows.values()) else {}
    out = []
    for rid, r in sorted(rows.items()):
        slots = sorted(held[rid], key=lambda h: (h["slot"], h["job_id"], h["execution_id"]))
        in_use = len({h["slot"] for h in slots})
        registered = r.status == "REGISTERED"
        beat = beats.get(rid)
        out.append(
            {
                "resource_id": rid,
                "host": r.host,
                "session": r.session,
                "state": r.status,
                "registered_at": r.since if registered else registrations.get((rid, r.session)),
                "since": r.since,
                "reason": r.reason,
                "labels": dict(r.labels),
                "slots_total": r.slots,
                "slots_in_use": in_use,
                "slots_free": max(r.slots - in_use, 0) if registered else 0,
                "slots": slots,
                "last_heartbeat": entry_order(beat)[0] if beat else None,
                "last_heartbeat_entry": beat,
            }
        )
    return out


def _held_now(log: EventLog, job_id: str) -> list[tuple[str, int, str, str]] | None:
    """The slots a job's attempts hold now, from its projected ExecutionGraph when that is up
    to date (None: it is not; fold the log)."""
    tag = log.keys.job(job_id)
    position, rows = ReadModels(log).read(tag, EXECUTION_GRAPH.name)
    if position is None or position != log.last_id(log.keys.facts(tag)):
        return None
    return sorted(
        (a["taskmanager"], a["slot"], job_id, f"{r['vertex']}:{r['subtask']}:{a['attempt']}")
        for key, r in rows.items()
        if key != "job"
        for a in (r, *r.get("beside", ()))  # (and attempts beside the current one: speculation)
        if a.get("taskmanager") is not None and a.get("slot") is not None and a.get("state") in _HOLDS
    )


def _registrations(log: EventLog, at: Moment) -> dict[tuple[str, str], int]:
    """(resource id, session) -> when that registration was recorded (a departed
    TaskManager's row's ``since`` says when it left)."""
    out = {}
    for _, env in facts_until(log, log.keys.facts(log.keys.cluster), at):
        ev = env.event
        if type(ev) is TaskManagerRegistered:
            out[(ev.resource_id, ev.session)] = env.ts
    return out


def _last_heartbeats(log: EventLog, at: Moment, sessions: dict[str, str]) -> dict[str, str]:
    """Resource id -> entry id of its session's newest heartbeat in the cluster inbox."""
    found: dict[str, str] = {}
    if not sessions:
        return found
    inbox = log.keys.inbox(log.keys.cluster)
    for entry_id, fields in entries_before(log, inbox, at.entry, HEARTBEATS_SEARCHED):
        try:
            ev = decode_fields(fields, stream=inbox, entry_id=entry_id).event
        except DecodeError:
            continue
        if (
            type(ev) is TaskManagerHeartbeat
            and sessions.get(ev.resource_id) == ev.session
            and ev.resource_id not in found
        ):
            found[ev.resource_id] = entry_id
            if len(found) == len(sessions):
                break
    return found
