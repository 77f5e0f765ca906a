"""What must hold in every simulated world, checked against the log and the tables.

The ``Observer`` folds every fact stream from the store with the components' own
``evolve`` (which refuses an illegal move with the subtask's story), incrementally, and
starts over when the store restarted (a restart may have lost writes). Checks against the
log outlive any refactoring of the actors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sluice.errors import IllegalTransition
from sluice.events import (
    FIELD,
    AttemptWon,
    JobRegistered,
    JobStatus,
    JobStatusChanged,
    ScheduleOrUpdateConsumers,
    SpeculativeAttemptScheduled,
    TaskState,
    UpdateTaskExecutionState,
)
from sluice.services.jobs.state import HOLDS_SLOT, TERMINAL_JOB, JobsState
from sluice.services.jobs.state import evolve as jobs_evolve
from sluice.services.membership.core import Membership
from sluice.services.membership.core import evolve as membership_evolve
from sluice.store import EventLog, tag_of

if TYPE_CHECKING:
    from .cluster import Simulation

__all__ = ["Observer", "Violation", "normal_jobs", "normal_membership", "check_retention"]


class Violation(BaseException):
    """An invariant does not hold (a BaseException: no component's error handling may
    swallow it when it is found inside that component's call)."""


class Observer:
    """The cluster as its durable log tells it, folded fact by fact."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.speculated: set[tuple[str, str, int, int]] = set()
        """Speculative attempts the log told of (job, vertex, subtask, attempt): kept across restarts."""
        self.won: dict[tuple[str, str, int], tuple[int, frozenset[int]]] = {}
        """Each race's winner and losers (job, vertex, subtask) -> (attempt, losers)."""
        self.reset()

    def reset(self) -> None:
        from sluice.store.memory import MemoryBackend

        self.generation = self.sim.store.generation
        self.reader = MemoryBackend(self.sim.store, name="observer")
        self.reader._generation = self.generation  # it saw this restart
        self.log = EventLog(self.reader, self.sim.keys, decode=self.sim.decode)
        self.membership = Membership()
        self.jobs = JobsState()
        self.positions: dict[str, str | None] = {}
        self.registered: list[str] = []
        self.finished: set[tuple[str, str, int]] = set()

    def catch_up(self) -> None:
        store = self.sim.store
        if store.generation != self.generation:
            self.reset()
        keys = self.sim.keys
        self._fold(keys.facts(keys.cluster), self._cluster)
        for job_id in self.registered:
            self._fold(keys.facts(keys.job(job_id)), self._job)

    def _fold(self, stream: str, apply: Any) -> None:
        after = self.positions.get(stream)
        while True:
            batch = self.log.read_page(stream, after or "0-0", count=1000)
            for entry_id, fields in batch:
                apply(stream, entry_id, self.log.decode(fields[FIELD]))
                after = entry_id
            if len(batch) < 1000:
                break
        self.positions[stream] = after

    def _cluster(self, stream: str, entry_id: str, env: Any) -> None:
        membership_evolve(self.membership, env)
        if isinstance(env.event, JobRegistered) and env.event.job_id not in self.registered:
            self.registered.append(env.event.job_id)

    def _job(self, stream: str, entry_id: str, env: Any) -> None:
        ev = env.event
        if type(ev) is UpdateTaskExecutionState:
            key = (ev.job_id, ev.vertex_id, ev.subtask)
            if ev.state == TaskState.SCHEDULED and key in self.finished:
                raise Violation(
                    f"{ev.execution_id} of {ev.job_id} is deployed again ({stream} {entry_id}) after an "
                    "attempt of its subtask FINISHED"
                )
        if type(ev) is SpeculativeAttemptScheduled or type(ev) is AttemptWon or self.speculated:
            self._speculation(stream, entry_id, ev)
        try:
            jobs_evolve(self.jobs, env)
        except IllegalTransition as exc:
            raise Violation(f"an illegal fact in {stream} {entry_id}: {exc}") from None
        except (KeyError, IndexError) as exc:
            raise Violation(f"a fact in {stream} {entry_id} does not fit the job: {type(exc).__name__} {exc}") from None
        if type(ev) is UpdateTaskExecutionState and ev.state == TaskState.FINISHED:
            self.finished.add((ev.job_id, ev.vertex_id, ev.subtask))
        if type(ev) is JobStatusChanged and ev.status == JobStatus.FINISHED:
            job = self.jobs.jobs[ev.job_id]
            if job.waiting_since is not None:  # every task was placed: the pass that placed the last closed it
                raise Violation(
                    f"job {ev.job_id} FINISHED ({stream} {entry_id}) with its wait for slots since "
                    f"{job.waiting_since} still open: no JobSlotsFound"
                )

    def _speculation(self, stream: str, entry_id: str, ev: Any) -> None:
        """Speculative execution's invariants, before the fact is folded: a speculative attempt
        runs on another TaskManager than its subtask's current attempt; a race has one winner
        (no loser of it ever wins it later); only the current attempt's partition is announced."""
        job = self.jobs.jobs.get(ev.job_id)
        if job is None:
            return
        if type(ev) is SpeculativeAttemptScheduled:
            self.speculated.add((ev.job_id, ev.vertex_id, ev.subtask, ev.attempt))
        elif type(ev) is AttemptWon and ev.losers:
            key = (ev.job_id, ev.vertex_id, ev.subtask)
            before = self.won.get(key)
            if before is not None and ev.attempt in before[1]:
                raise Violation(
                    f"attempt {ev.attempt} of {ev.vertex_id}[{ev.subtask}] of {ev.job_id} wins ({stream} {entry_id}) "
                    f"a race it lost to attempt {before[0]}"
                )
            self.won[key] = (ev.attempt, frozenset(ev.losers))
        elif type(ev) is UpdateTaskExecutionState and ev.state == TaskState.SCHEDULED:
            if (ev.job_id, ev.vertex_id, ev.subtask, ev.attempt) in self.speculated:
                current = job.vertices[ev.vertex_id].subtasks[ev.subtask]
                if (
                    current.attempt != ev.attempt
                    and current.taskmanager == ev.taskmanager
                    and (current.state in HOLDS_SLOT)
                ):
                    raise Violation(
                        f"speculative attempt {ev.execution_id} of {ev.job_id} placed ({stream} {entry_id}) on "
                        f"{ev.taskmanager}, where attempt {current.attempt} of its subtask runs"
                    )
        elif type(ev) is ScheduleOrUpdateConsumers:
            current = job.vertices[ev.vertex_id].subtasks[ev.subtask]
            if current.attempt != ev.attempt:
                raise Violation(
                    f"{ev.execution_id} of {ev.job_id} announced its partition ({stream} {entry_id}), but attempt "
                    f"{current.attempt} is its subtask's current one: consumers would read a loser"
                )

    # --- end-state checks ---
    def ended(self, job_id: str) -> bool:
        job = self.jobs.jobs.get(job_id)
        return job is not None and job.status in TERMINAL_JOB


def normal_jobs(state: JobsState) -> dict[str, Any]:
    """A job state as comparable data: what replay must rebuild exactly."""
    out: dict[str, Any] = {}
    for job_id, job in sorted(state.jobs.items()):
        out[job_id] = {
            "status": job.status.value,
            "reason": job.reason,
            "restarts": job.restarts,
            "built": job.built,
            "times": (job.submitted_at, job.ended_at),
            "history": list(job.history),
            "waiting": (job.waiting_since, job.wait_until_placed, job.slot_taken_at),
            "tasks": {
                ex.id: (
                    ex.state.value,
                    ex.taskmanager,
                    ex.slot,
                    ex.produced,
                    ex.not_before,
                    ex.seq,
                    ex.session,
                    ex.placed_epoch,
                    ex.since,
                    ex.error,
                    list(ex.history),
                )
                for ex in job.executions()
            },
            "kvstate": {
                name: sorted(loc.to_dict().items()) if hasattr(loc, "to_dict") else repr(loc)
                for name, loc in sorted(job.kvstate.locations.items())
            },
        }
    out["_pool"] = state.pool.holders()
    return out


def normal_membership(state: Membership) -> dict[str, Any]:
    return {rid: (r.session, r.status, r.slots, r.since, r.reason) for rid, r in sorted(state.taskmanagers.items())}


def check_outboxes(sim: Simulation) -> None:
    """Every outbox entry up to its cursor is in its target inbox exactly once (or parked
    with the reason); no inbox holds one outbox entry twice."""
    store, keys = sim.store, sim.keys
    # Delivered to an inbox a hostile client then destroyed (the same entry again only if a
    # loss of writes undid the clobber: any other copy is a second delivery).
    seen: dict[tuple[str, str], tuple[str, str]] = dict(sim.watch.clobbered)
    for stream in store.streams():
        if not keys.is_inbox(stream):
            continue
        for entry_id, fields in store.entries(stream):
            origin, ref = fields.get(b"from"), fields.get(b"ref")
            if origin is None or ref is None:
                continue
            k = (origin.decode(), ref.decode())
            if k in seen and seen[k] != (stream, entry_id):
                raise Violation(
                    f"outbox entry {k[1]} of {k[0]} was delivered twice: to {seen[k][0]} and {stream} ({entry_id})"
                )
            seen[k] = (stream, entry_id)
    for stream in store.streams():
        if not keys.is_outbox(stream):
            continue
        tag = tag_of(stream)
        cursor = sim.observer.reader.get(keys.outbox_cursor(tag))
        if cursor is None:
            continue
        parked = {f.get(b"entry", b"").decode() for _, f in store.entries(keys.dead(tag))}
        upto = _order(cursor.decode())
        for entry_id, fields in store.entries(stream):
            if _order(entry_id) > upto:
                break
            target = fields.get(b"to")
            if target is None or entry_id in parked or _released(sim, target.decode()):
                continue
            if (stream, entry_id) not in seen:
                raise Violation(
                    f"outbox entry {entry_id} of {stream} (to {target.decode()[:60]}) is behind the "
                    f"cursor {cursor.decode()} but was never delivered"
                )


def _released(sim: Simulation, inbox: str) -> bool:
    """Whether ``inbox`` is an ended job's: released with its transport once archived
    (services/jobmanager/retention.py), what was delivered there went with it."""
    job_id = sim.keys.job_id_of(tag_of(inbox))
    run = sim.observer.jobs.jobs.get(job_id) if job_id is not None else None
    return run is not None and run.status in TERMINAL_JOB


def check_retention(sim: Simulation, leader: Any) -> None:
    """After settling: an archived job's transport streams are gone, and no inbox the leader
    serves keeps acknowledged entries older than its retention (and a sweep)."""
    from sluice.services.jobmanager.retention import SWEEP_EVERY_MS, subtask_inboxes

    keys, streams = sim.keys, set(sim.store.streams())
    snapshots = getattr(leader, "snapshots", None)
    for job_id in snapshots.archived if snapshots is not None else ():
        run = sim.observer.jobs.jobs.get(job_id)
        if run is None or run.ended_at is None:
            continue
        # (a message sent to the job after its release makes its inbox again: a stray, kept).
        # When it ended in Redis's time, the time of entry ids: the leader's stamp is its own
        # wall clock's, which clock_skew puts off.
        changes = [
            i
            for i, fields in sim.store.entries(keys.facts(keys.job(job_id)))
            if b"JobStatusChanged" in fields.get(FIELD, b"")
        ]
        ended = _order(changes[-1])[0] if changes else run.ended_at
        kept = [
            k
            for k in keys.transport(keys.job(job_id), subtask_inboxes(keys, run))
            if k in streams and any(_order(i)[0] < ended for i, _ in sim.store.entries(k)[:1])
        ]
        if kept:
            raise Violation(f"job {job_id} is archived but its transport streams are still there: {kept}")
    horizon = (max(sim.world.now - leader.retention.inbox_retention_ms - 2 * SWEEP_EVERY_MS, 0), 0)
    for inbox in [leader.inbox, *(keys.inbox(keys.job(j)) for j in leader.state.jobs.jobs)]:
        state = sim.observer.reader.group_state(inbox, leader.group)
        entries = sim.store.entries(inbox) if state is not None else []
        bound = (
            min(_order(state.last_delivered), _order(state.min_pending), horizon)
            if state and state.min_pending
            else min(_order(state.last_delivered), horizon)
            if state
            else (0, 0)
        )
        if entries and _order(entries[0][0]) < bound:
            raise Violation(f"{inbox} keeps acknowledged entries older than its retention: {entries[0][0]}")


def _order(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def check_kvstate(job_id: str, run: Any) -> None:
    """Queryable state is served only by attempts that count: no registration names an
    attempt that is not its subtask's current one or that failed (a failed attempt's state
    is unregistered in the decision that fails it); a FINISHED job's state covers every key
    group, each by a FINISHED attempt."""
    from sluice.services.jobs.state import parse_execution_id

    for name, loc in run.kvstate.locations.items():
        for entry in loc.entries.values():
            if entry.execution_id is None:
                continue
            vertex, subtask, attempt = parse_execution_id(entry.execution_id)
            ex = run.vertices[vertex].subtasks[subtask]
            if ex.attempt != attempt or ex.state in (TaskState.FAILED, TaskState.CANCELED):
                raise Violation(
                    f"job {job_id}: queryable state {name!r} key groups {entry.start}..{entry.end} are "
                    f"served by {entry.execution_id}, but {vertex}[{subtask}] is at attempt {ex.attempt} "
                    f"({ex.state.value})"
                )
            if run.status == JobStatus.FINISHED and ex.state != TaskState.FINISHED:
                raise Violation(
                    f"job {job_id} FINISHED with {name!r} served by {entry.execution_id}, which is {ex.state.value}"
                )
        if run.status == JobStatus.FINISHED and loc.registered_key_groups != loc.num_key_groups:
            raise Violation(
                f"job {job_id} FINISHED with {loc.registered_key_groups} of {loc.num_key_groups} key "
                f"groups of {name!r} registered"
            )


def check_job_result(sim: Simulation, job: Any, run: Any) -> None:
    """A FINISHED job consumed each split exactly once: the sink holds every split id once."""
    check_kvstate(job.job_id, run)
    if run.status != JobStatus.FINISHED:
        if run.status == JobStatus.FAILED and not run.reason:
            raise Violation(f"job {job.job_id} FAILED without a root cause")
        return
    got = sorted(sim.files.sink_ids(job.sink_path))
    want = list(range(job.splits))
    if got != want:
        missing = sorted(set(want) - set(got))
        extra = sorted(i for i in set(got) if got.count(i) > 1)
        raise Violation(f"job {job.job_id} FINISHED, but its sink holds {got}: missing {missing}, twice {extra}")
