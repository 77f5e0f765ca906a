"""A job's story, folded from its fact stream up to a moment (``sluice inspect job``, the
dashboard's job page).

JSON::

    {"job": {... the row of sluice.views.jobs ...},
     "events": [{"at": ms, "entry": id, "kind": str, "type": event type, "text": str,
                 and for a subtask's events "vertex", "subtask", "attempt" (and "state", "error")}],
     "attempts": [{"vertex", "subtask", "attempt", "taskmanager", "slot",
                   "states": [{"state", "at", "entry", "duration_s"}],
                   "started_at", "ended_at", "duration_s", "final", "error",
                   "splits": [{"split", "what", "at", "outcome"}],
                   and for speculative execution: "speculative": {"beside", "elapsed_ms",
                   "baseline_ms"} on a speculative attempt, "race": "won" | "lost"}],
     "root_cause": {"text", "traceback", "attempt", "at", "job_failed"} | None,
     "restarts": int,
     "entries": [every fact entry id of the job up to the moment, in order]}

``kind`` is one of submitted, graph-built, state, produced, restart, job-status, waiting,
slots-found, split-request, split, no-more-splits, operator-event, checkpoint, kvstate, renumbered,
speculative, won, disposed (any other fact: its type). An attempt starts when it is SCHEDULED (deployed)
and ends at its final state; durations of what has not ended run to the moment (now: the
wall clock). The root cause is the job's when it failed (its reason, with the traceback
of the attempt whose failure failed it, if one did), else the last failure of an attempt
(then ``job_failed`` is false), else None.
"""

from __future__ import annotations

from typing import Any

from sluice.events import (
    AttemptsRenumbered,
    AttemptWon,
    CoordinatorCheckpointed,
    Envelope,
    ExecutionGraphBuilt,
    JobDisposed,
    JobSlotsFound,
    JobStatusChanged,
    JobSubmitted,
    JobWaitingForSlots,
    KvStateNotificationRefused,
    NextInputSplit,
    NotifyKvStateRegistered,
    NotifyKvStateUnregistered,
    OperatorEvent,
    RequestNextInputSplit,
    ScheduleOrUpdateConsumers,
    SpeculativeAttemptScheduled,
    TaskRestartScheduled,
    UpdateTaskExecutionState,
)
from sluice.services.coordination.timeline import describe_split, split_timeline
from sluice.services.jobs.state import JobsState, evolve, parse_execution_id
from sluice.store import EventLog

from .history import Moment, facts_until
from .jobs import job_row, require_job, until_ms

__all__ = ["timeline", "first_line", "headline"]


def first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""


def headline(error: str | None) -> str:
    """What a person reads first of an error: a traceback's last line (the exception),
    else its first line."""
    lines = [ln for ln in (error or "").strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    if any("Traceback (most recent call last)" in ln for ln in lines):
        return lines[-1].strip()
    return lines[0].strip()


def _subtask(ev: Any, attempt: int) -> dict:
    return {"vertex": ev.vertex_id, "subtask": ev.subtask, "attempt": attempt}


def _describe(env: Envelope) -> tuple[str, str, dict]:
    """(kind, text, extra fields) of one fact."""
    ev = env.event
    if isinstance(ev, UpdateTaskExecutionState):
        on = f" on {ev.taskmanager} slot {ev.slot}" if ev.taskmanager is not None else ""
        err = f": {headline(ev.error)}" if ev.error else ""
        extra = {**_subtask(ev, ev.attempt), "state": ev.state._value_, "error": ev.error}
        return "state", f"{ev.vertex_id}[{ev.subtask}] attempt {ev.attempt} {ev.state._value_}{on}{err}", extra
    if isinstance(ev, ScheduleOrUpdateConsumers):
        return (
            "produced",
            f"{ev.vertex_id}[{ev.subtask}] attempt {ev.attempt}: its partition is ready",
            _subtask(ev, ev.attempt),
        )
    if isinstance(ev, TaskRestartScheduled):
        return (
            "restart",
            (f"{ev.vertex_id}[{ev.subtask}] restarts as attempt {ev.attempt} (restart {ev.restarts} of the job)"),
            _subtask(ev, ev.attempt),
        )
    if isinstance(ev, SpeculativeAttemptScheduled):
        return (
            "speculative",
            (
                f"{ev.vertex_id}[{ev.subtask}] attempt {ev.original} is slow ({ev.elapsed_ms} ms, past "
                f"{ev.baseline_ms} ms): speculative attempt {ev.attempt} starts beside it"
            ),
            _subtask(ev, ev.attempt),
        )
    if isinstance(ev, AttemptWon):
        over = f"won over attempt {', '.join(map(str, ev.losers))}" if ev.losers else "carries on alone"
        return "won", f"{ev.vertex_id}[{ev.subtask}] attempt {ev.attempt} {over}", _subtask(ev, ev.attempt)
    if isinstance(ev, JobStatusChanged):
        why = f": {first_line(ev.reason)}" if ev.reason else ""
        return "job-status", f"job {ev.status._value_}{why}", {"status": ev.status._value_, "reason": ev.reason}
    if isinstance(ev, JobSubmitted):
        n = sum(v.parallelism for v in ev.graph.vertices)
        return (
            "submitted",
            (
                f"submitted {ev.graph.name!r}: {len(ev.graph.vertices)} vertices, {n} subtasks, "
                f"{sum(len(s) for s in ev.splits.values())} splits"
            ),
            {},
        )
    if isinstance(ev, ExecutionGraphBuilt):
        return "graph-built", f"ExecutionGraph built: {ev.subtasks} subtasks", {}
    if isinstance(ev, JobWaitingForSlots):
        return "waiting", f"waiting for slots: {ev.needed} wanted, {ev.free} free", {}
    if isinstance(ev, JobSlotsFound):
        return "slots-found", "every deployable task has a slot: the wait for slots ended", {}
    if isinstance(ev, AttemptsRenumbered):
        return "renumbered", f"attempts renumbered from {ev.attempt_floor}: {ev.reason}", {}
    if isinstance(ev, RequestNextInputSplit):
        attempt = parse_execution_id(ev.execution_id)[2]
        return (
            "split-request",
            f"{ev.vertex_id}[{ev.subtask}] attempt {attempt} asks for a split",
            _subtask(ev, attempt),
        )
    if isinstance(ev, NextInputSplit):
        vertex, subtask, attempt = parse_execution_id(ev.execution_id)
        where = {"vertex": vertex, "subtask": subtask, "attempt": attempt}
        if ev.split is None:
            return "no-more-splits", f"{vertex}[{subtask}] attempt {attempt}: no more splits", where
        return "split", f"{vertex}[{subtask}] attempt {attempt} takes {_split_text(ev.split)}", where
    if isinstance(ev, OperatorEvent):
        where = {"vertex": ev.operator_id, "subtask": ev.subtask, "attempt": ev.attempt}
        body = ev.body if isinstance(ev.body, dict) else {}
        kind = body.get("type")
        if ev.to_coordinator and kind == "request-split":
            return "split-request", f"{ev.operator_id}[{ev.subtask}] attempt {ev.attempt} asks for a split", where
        if not ev.to_coordinator and kind == "split":
            return (
                "split",
                f"{ev.operator_id}[{ev.subtask}] attempt {ev.attempt} takes {_split_text(body.get('split'))}",
                where,
            )
        if not ev.to_coordinator and kind == "no-more-splits":
            return "no-more-splits", f"{ev.operator_id}[{ev.subtask}] attempt {ev.attempt}: no more splits", where
        arrow = "→ coordinator" if ev.to_coordinator else "← coordinator"
        return (
            "operator-event",
            f"{ev.operator_id}[{ev.subtask}] attempt {ev.attempt} {arrow}: {_short(ev.body)}",
            where,
        )
    if isinstance(ev, CoordinatorCheckpointed):
        released = f", releasing {ev.released} events" if ev.released else ""
        return (
            "checkpoint",
            f"coordinator of {ev.operator_id} checkpointed ({ev.checkpoint_id}){released}",
            {"vertex": ev.operator_id},
        )
    if isinstance(ev, JobDisposed):
        return "disposed", "job disposed: its queryable state released", {}
    if isinstance(ev, NotifyKvStateRegistered):
        r = ev.key_group_range
        return (
            "kvstate",
            (
                f"queryable state {ev.registration_name!r} of {ev.vertex_id}: key groups {r.start}..{r.end} "
                f"registered by {ev.execution_id or 'an attempt'} at {ev.server_address}"
            ),
            {},
        )
    if isinstance(ev, NotifyKvStateUnregistered):
        r = ev.key_group_range
        return (
            "kvstate",
            (f"queryable state {ev.registration_name!r} of {ev.vertex_id}: key groups {r.start}..{r.end} unregistered"),
            {},
        )
    if isinstance(ev, KvStateNotificationRefused):
        return "kvstate", f"queryable state {ev.registration_name!r}: {ev.notification} refused: {ev.reason}", {}
    kind = type(ev).__name__
    return kind, kind, {}


def _split_text(split: object) -> str:
    if isinstance(split, dict):
        return f"split {split.get('index', '?')} ({describe_split(split)})"
    return f"split {_short(split)}"


def _short(value: object, limit: int = 80) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _attempt(vertex: str, subtask: int, attempt: int, at: int, entry: str) -> dict:
    return {
        "vertex": vertex,
        "subtask": subtask,
        "attempt": attempt,
        "taskmanager": None,
        "slot": None,
        "states": [{"state": "CREATED", "at": at, "entry": entry, "duration_s": None}],
        "started_at": None,
        "ended_at": None,
        "duration_s": None,
        "final": "CREATED",
        "error": None,
        "splits": [],
    }


def timeline(log: EventLog, job_id: str, at: Moment = Moment(None)) -> dict:
    """The job's story up to the moment. Raises SluiceError for a job the log never had."""
    require_job(log, job_id)
    state = JobsState()
    events: list[dict] = []
    entries: list[str] = []
    envs: list[Envelope] = []
    attempts: dict[tuple[str, int, int], dict] = {}
    last_failure: tuple[dict, int] | None = None
    for entry_id, env in facts_until(log, log.keys.facts(log.keys.job(job_id)), at):
        evolve(state, env)
        entries.append(entry_id)
        envs.append(env)
        kind, text, extra = _describe(env)
        events.append(
            {"at": env.ts, "entry": entry_id, "kind": kind, "type": type(env.event).__name__, "text": text, **extra}
        )
        ev = env.event
        if isinstance(ev, ExecutionGraphBuilt) and (run := state.jobs.get(job_id)) is not None:
            for ex in run.executions():
                attempts.setdefault(
                    (ex.vertex, ex.subtask, ex.attempt), _attempt(ex.vertex, ex.subtask, ex.attempt, env.ts, entry_id)
                )
        elif isinstance(ev, SpeculativeAttemptScheduled):
            a = attempts.setdefault(
                (ev.vertex_id, ev.subtask, ev.attempt), _attempt(ev.vertex_id, ev.subtask, ev.attempt, env.ts, entry_id)
            )
            a["speculative"] = {"beside": ev.original, "elapsed_ms": ev.elapsed_ms, "baseline_ms": ev.baseline_ms}
        elif isinstance(ev, AttemptWon) and ev.losers:
            for attempt in (ev.attempt, *ev.losers):
                if (key := (ev.vertex_id, ev.subtask, attempt)) in attempts:
                    attempts[key]["race"] = "won" if attempt == ev.attempt else "lost"
        elif isinstance(ev, TaskRestartScheduled):
            attempts.setdefault(
                (ev.vertex_id, ev.subtask, ev.attempt), _attempt(ev.vertex_id, ev.subtask, ev.attempt, env.ts, entry_id)
            )
        elif isinstance(ev, UpdateTaskExecutionState):
            a = attempts.setdefault(
                (ev.vertex_id, ev.subtask, ev.attempt), _attempt(ev.vertex_id, ev.subtask, ev.attempt, env.ts, entry_id)
            )
            a["states"].append({"state": ev.state._value_, "at": env.ts, "entry": entry_id, "duration_s": None})
            a["final"] = ev.state._value_
            if ev.taskmanager is not None:
                a["taskmanager"], a["slot"] = ev.taskmanager, ev.slot
            if ev.error is not None:
                a["error"] = ev.error
            if ev.state._value_ == "SCHEDULED" and a["started_at"] is None:
                a["started_at"] = env.ts
            if ev.state.terminal:
                a["ended_at"] = env.ts
            if ev.state._value_ == "FAILED":
                last_failure = (a, env.ts)
    end = until_ms(at)
    for a in attempts.values():
        states = a["states"]
        for this, nxt in zip(states, states[1:] + [None]):
            if nxt is not None:
                this["duration_s"] = round(max(nxt["at"] - this["at"], 0) / 1000, 3)
            elif a["ended_at"] is None:
                this["duration_s"] = round(max(end - this["at"], 0) / 1000, 3)
        if a["started_at"] is not None:
            stop = a["ended_at"] if a["ended_at"] is not None else end
            a["duration_s"] = round(max(stop - a["started_at"], 0) / 1000, 3)
    for row in split_timeline(envs):
        holder = attempts.get((row.vertex, row.subtask, row.attempt))
        if holder is not None:
            holder["splits"].append({"split": row.split, "what": row.what, "at": row.at, "outcome": row.outcome})
    run = state.jobs.get(job_id)
    job = job_row(job_id, run, at)
    return {
        "job": job,
        "events": events,
        "attempts": sorted(attempts.values(), key=lambda a: (a["vertex"], a["subtask"], a["attempt"])),
        "root_cause": _root_cause(job, last_failure),
        "restarts": run.restarts if run is not None else 0,
        "entries": entries,
    }


def _root_cause(job: dict, last_failure: tuple[dict, int] | None) -> dict | None:
    failed = job["status"] in ("FAILED", "FAILING") and bool(job["reason"])
    if failed:
        reason = job["reason"]
        attempt = last_failure[0] if last_failure is not None else None
        if attempt is None or not attempt["error"] or attempt["error"] not in reason:
            attempt = None  # the job failed for a reason of its own (a coordinator, a state clash)
        return {
            "text": _summary(reason),
            "traceback": attempt["error"] if attempt is not None else reason,
            "attempt": _eid(attempt),
            "at": job["ended_at"] or (last_failure[1] if last_failure else None),
            "job_failed": True,
        }
    if last_failure is None:
        return None
    a, ts = last_failure
    return {
        "text": f"{a['vertex']}[{a['subtask']}] attempt {a['attempt']} failed: {headline(a['error'])}",
        "traceback": a["error"],
        "attempt": _eid(a),
        "at": ts,
        "job_failed": False,
    }


def _summary(reason: str) -> str:
    """ "task src[0] failed after 3 restarts: Traceback ... ValueError: boom" -> its first
    line with the exception in place of the traceback."""
    head = first_line(reason)
    cut = head.find("Traceback (most recent call last)")
    if cut < 0:
        return head
    return (head[:cut].rstrip() + " " + headline(reason)).strip()


def _eid(a: dict | None) -> str | None:
    return None if a is None else f"{a['vertex']}:{a['subtask']}:{a['attempt']}"
