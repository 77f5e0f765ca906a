"""Bounded storage: the leader trims what its streams carried once it is consumed and
delivered, releases an archived job's transport keys, and purges jobs.

What may go, and up to where, is decided by a pure core (no Redis, no clock):

* an inbox up to what its consumer group was delivered and acknowledged, never past an
  entry still pending (a crashed reader's entries wait to be reclaimed) or not yet
  delivered (``EventLog.trim_consumed``);
* an outbox up to its delivery cursor, never past an undelivered entry (recovery delivers
  again from the cursor: ``EventLog.trim_delivered``);
* a subtask's inbox once its current attempt has ended (an attempt reads only its own
  entries, so nothing before that attempt's end is read again: ``finished_subtasks``);
* every one of them keeps the last ``inbox_retention_ms`` of its traffic for inspection;
* an archived job's transport keys go at once, its outbox delivered to its end (its facts
  tell its whole story); its facts go only by ``sluice job purge`` or a fact retention
  (``FactRetention``; default: keep them).

The shell (``Retention``) carries the decisions out from the leader's tick, through store/.
A purge is event-sourced: ``PurgeJob`` on the cluster inbox, carried out by the leader,
recorded as the cluster fact ``JobPurged`` (a later replay leaves the job out), with a
tombstone row written first so a leader that dies half-way finishes it when the request
comes again.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from sluice.errors import ConfigError
from sluice.events import JobPurged, JobRefused, PurgeJob
from sluice.services.common.world import World, monotonic_ms
from sluice.services.jobs.machine import TERMINAL_JOB, TERMINAL_TASK
from sluice.services.jobs.state import JobRun
from sluice.store import Consumed, EventLog, Keys, entry_order, tag_of
from sluice.store.purge import Tombstones, delete_tag, forget_deliveries, release_transport

from .committer import Committer
from .snapshot import SnapshotWriter, load_job
from .state import CurrentState

if TYPE_CHECKING:
    from sluice.store.consumer import Entry

__all__ = [
    "FactRetention",
    "Retention",
    "finished_subtasks",
    "subtask_inboxes",
    "due_for_purge",
    "purge_refusal",
    "SWEEP_EVERY_MS",
]

SWEEP_EVERY_MS = 10_000
"""The longest time between two trims of the leader's streams (shorter when the retention is)."""

_DAY_MS = 86_400_000


# --- the pure core ----------------------------------------------------------------------------


@dataclass(frozen=True)
class FactRetention:
    """How long the facts of archived jobs are kept: ``keep_last`` jobs, or ``keep_days``
    days after they ended (None both: for ever, the default)."""

    keep_last: int | None = None
    keep_days: float | None = None

    @classmethod
    def parse(cls, text: str | None, *, where: str = "$SLUICE_FACT_RETENTION") -> FactRetention:
        """``keep`` (or nothing), ``<N>`` (the last N archived jobs) or ``<N>d`` (N days)."""
        value = (text or "keep").strip().lower()
        if value == "keep":
            return cls()
        m = re.fullmatch(r"(\d+(?:\.\d+)?)d", value)
        if m:
            return cls(keep_days=float(m.group(1)))
        if value.isdigit():
            return cls(keep_last=int(value))
        raise ConfigError(
            f"{where} = {text!r} is not a fact retention: give 'keep' (the default), a number of "
            "archived jobs whose facts are kept (e.g. 1000), or days (e.g. 30d)"
        )

    @classmethod
    def from_env(cls) -> FactRetention:
        return cls.parse(os.environ.get("SLUICE_FACT_RETENTION"))

    @property
    def keeps_all(self) -> bool:
        return self.keep_last is None and self.keep_days is None


def due_for_purge(
    archived: Sequence[str], policy: FactRetention, now_ms: int, ended_at: Callable[[str], int | None]
) -> list[str]:
    """Archived jobs (oldest first, as archived) whose facts the policy no longer keeps:
    beyond the last ``keep_last``, or ended more than ``keep_days`` ago (``ended_at`` is
    asked of the oldest ones only, until one is young enough)."""
    if policy.keep_last is not None:
        return list(archived[: max(len(archived) - policy.keep_last, 0)])
    if policy.keep_days is None:
        return []
    # A wall-clock comparison on purpose: ``ended_at`` is a job's end as the log stamped it
    # (another leader's wall clock, perhaps days ago), and days of retention are days of the
    # calendar; a step or skew of seconds moves a purge by as much, which nothing relies on.
    horizon = now_ms - policy.keep_days * _DAY_MS
    out = []
    for job_id in archived:
        ended = ended_at(job_id)
        if ended is not None and ended >= horizon:
            break
        out.append(job_id)
    return out


def finished_subtasks(job: JobRun) -> list[tuple[str, int, int]]:
    """(vertex, subtask, attempt) of every subtask whose current attempt has ended: its inbox
    holds nothing any attempt will read (a later attempt reads only its own entries)."""
    return [(ex.vertex, ex.subtask, ex.attempt) for ex in job.executions() if ex.state in TERMINAL_TASK]


def subtask_inboxes(keys: Keys, job: JobRun) -> list[str]:
    """Every subtask inbox a job can have had."""
    tag = keys.job(job.job_id)
    return [keys.task_inbox(tag, v.name, i) for v in job.graph.vertices for i in range(v.parallelism)]


def purge_refusal(job_id: str, job: JobRun | None, known: bool, holds_slots: bool = False) -> str | None:
    """Why ``job_id`` cannot be purged (None: it can)."""
    if not known or job is None:
        return f"job not found: {job_id} (no such job in this cluster; `sluice list` shows the jobs)"
    if job.status not in TERMINAL_JOB:
        return (
            f"job {job_id} is {job.status.value}: only an ended job can be purged; cancel it first "
            f"(sluice cancel {job_id}) or wait until it ends"
        )
    if holds_slots:
        return f"job {job_id} has ended but its last tasks still hold slots; purge it again in a few seconds"
    return None


# --- the shell --------------------------------------------------------------------------------


class FollowedInboxes(Protocol):
    """Which jobs' inboxes the leader reads (services/jobmanager/job_inboxes.py)."""

    def following(self, job_id: str) -> bool: ...

    def unfollow(self, job_id: str) -> None: ...


class Retention:
    """The leader's trimming and purging (a collaborator of the JobManager's tick). Built
    from the log, the committer, the leader's state (as it is now), the ids of the jobs
    registered and purged, the world, a logger, the inboxes followed, ``restore(job_id)``
    (an archived job brought back: services/jobmanager/snapshot.py), ``snapshots()`` (the
    leader's snapshot writer, None while it has none), how long the streams keep their
    traffic, the consumer group and the fact retention."""

    def __init__(
        self,
        *,
        log: EventLog,
        committer: Committer,
        state: CurrentState,
        registered: set[str],
        purged: set[str],
        world: World,
        logger: Any,
        inboxes: FollowedInboxes,
        restore: Callable[[str], bool],
        snapshots: Callable[[], SnapshotWriter | None],
        inbox_retention_ms: int,
        group: str,
        facts: FactRetention | None = None,
    ) -> None:
        self.log, self.keys, self.committer, self.state = log, log.keys, committer, state
        self.registered, self.purged, self.world, self.logger = registered, purged, world, logger
        self.inboxes, self.restore, self.snapshots = inboxes, restore, snapshots
        self.inbox_retention_ms, self.group = inbox_retention_ms, group
        self.tag = self.keys.cluster
        self.facts = facts if facts is not None else FactRetention.from_env()
        self.tombstones = Tombstones(log)
        self._next = 0
        self._trimmed: set[tuple[str, str, int, int]] = set()
        """Subtask attempts whose inbox was trimmed past their last entry (nothing more to do)."""

    def reset(self) -> None:
        """A new leadership: trim at its first tick."""
        self._next = 0
        self._trimmed.clear()

    def tick(self, now: int) -> None:
        """Trim every stream the leader serves (at most every ``SWEEP_EVERY_MS``), and purge
        the archived jobs the fact retention no longer keeps."""
        clock = monotonic_ms(self.world)  # the sweep's schedule; what is kept is judged by ``now`` (see below)
        if clock < self._next:
            return
        keys, log, keep = self.keys, self.log, self.inbox_retention_ms
        self._next = clock + min(keep, SWEEP_EVERY_MS)
        # Entry ids are the Redis server's clock, ``now`` the leader's wall clock: a skew or a
        # step between them keeps the last ``keep`` ms of traffic (for inspection only, minutes
        # long) that much longer or shorter, which nothing relies on; no monotonic clock is
        # shared with the server to compare them by.
        log.trim_consumed(keys.inbox(self.tag), self.group, keep_ms=keep, now_ms=now)
        log.trim_delivered(self.tag, keep_ms=keep, now_ms=now)
        for job_id, job in list(self.state().jobs.jobs.items()):
            self._trim_job(job_id, job, now)
        snapshots = self.snapshots()
        if not self.facts.keeps_all and snapshots is not None:
            for job_id in due_for_purge(list(snapshots.archived), self.facts, now, self._ended_at)[:100]:
                self.purge(job_id, now)

    def _trim_job(self, job_id: str, job: JobRun, now: int) -> None:
        keys, log, keep = self.keys, self.log, self.inbox_retention_ms
        tag = keys.job(job_id)
        if self.inboxes.following(job_id):
            log.trim_consumed(keys.inbox(tag), self.group, keep_ms=keep, now_ms=now)
        log.trim_delivered(tag, keep_ms=keep, now_ms=now)
        for vertex, subtask, attempt in finished_subtasks(job):
            done = (job_id, vertex, subtask, attempt)
            if done in self._trimmed:
                continue
            inbox = keys.task_inbox(tag, vertex, subtask)
            last = log.last_id(inbox)
            if last is not None:
                log.trim_read(inbox, last, keep_ms=keep, now_ms=now)
            if last is None or entry_order(last)[0] <= now - keep:  # nothing of it is kept any more
                self._trimmed.add(done)

    # --- archived jobs ---
    def release(self, job_ids: Sequence[str]) -> None:
        """Jobs being archived (ended, in their snapshots): their transport keys go, once
        their outbox is delivered to its end. Called before the archive is recorded, so a
        leader that dies in between archives, and releases, them again."""
        jobs = self.state().jobs
        for job_id in job_ids:
            job = jobs.jobs.get(job_id)
            if job is None:
                continue
            tag = self.keys.job(job_id)
            self.committer.deliver(tag)
            self.committer.retire(tag)  # its cursor moved to where delivery ended
            if not self._delivered(tag):
                self.logger.warning(
                    "an archived job's outbox is not delivered to its end; its transport stays", job=job_id
                )
                continue
            release_transport(self.log, tag, subtask_inboxes(self.keys, job))
            self._trimmed = {t for t in self._trimmed if t[0] != job_id}

    def _delivered(self, tag: str) -> bool:
        last = self.log.last_id(self.keys.outbox(tag))
        cursor = self.log.backend.get(self.keys.outbox_cursor(tag))
        return last is None or (cursor is not None and entry_order(cursor.decode()) >= entry_order(last))

    def _targets(self, job: JobRun | None) -> list[str]:
        """The tags a job's outbox can have delivered to: the TaskManagers, its client, the cluster."""
        keys = self.keys
        out = [keys.taskmanager(rid) for rid in self.state().membership.taskmanagers] + [self.tag]
        if job is not None and keys.inbox_problem(job.reply_to, ("client",)) is None:
            out.append(tag_of(job.reply_to))
        return out

    def _ended_at(self, job_id: str) -> int | None:
        snap = load_job(self.log, job_id)
        return snap.run.ended_at if snap.run is not None else None

    # --- purging ---
    def on_request(self, entry: Entry, msg: PurgeJob) -> None:
        """``PurgeJob`` from the cluster inbox: carried out, or refused with the reason; the
        reply and the request's acknowledgement go in one cluster commit."""
        known = msg.job_id in self.registered
        reply: JobPurged | JobRefused
        if msg.job_id in self.purged:
            row = self.tombstones.read(msg.job_id) or {}
            reply = JobRefused(
                msg.job_id, f"job {msg.job_id} was already purged (at {row.get('purged_at', '?')} ms since the epoch)"
            )
        else:
            done = (
                self.purge(msg.job_id, self.world.now_ms(), known=known, reply_to=msg.reply_to, consumed=entry)
                if known
                else None
            )
            if done is not None:
                return
            reply = JobRefused(msg.job_id, self._refusal(msg.job_id, known))
        self.logger.warning("purge refused", job=msg.job_id[:40], reason=reply.reason[:300])
        self.committer.commit(
            self.tag, [], sends=[(msg.reply_to, reply)], consumed=self._consumed(entry), cause=entry.envelope.id
        )

    def _consumed(self, entry: Entry) -> Consumed:
        return Consumed(entry.stream, self.group, entry.id)

    def _refusal(self, job_id: str, known: bool) -> str:
        state = self.state().jobs
        return (
            purge_refusal(job_id, state.jobs.get(job_id), known, state.pool.holds(job_id))
            or f"job {job_id} cannot be purged"
        )

    def purge(
        self, job_id: str, now: int, *, known: bool = True, reply_to: str | None = None, consumed: Entry | None = None
    ) -> JobPurged | None:
        """Remove an ended job's keys and record ``JobPurged`` (with the reply to ``reply_to``
        and the acknowledgement of ``consumed``, in one cluster commit); None when the job
        cannot be purged (nothing was done). The tombstone is written first: a leader that
        dies half-way finds it when the request comes again, and finishes."""
        row = self.tombstones.read(job_id)
        if row is None:
            self.restore(job_id)  # an archived job left the leader's memory: its status from its snapshot
            jobs = self.state().jobs
            job = jobs.jobs.get(job_id)
            if job is None or purge_refusal(job_id, job, known, jobs.pool.holds(job_id)) is not None:
                return None
            row = {
                "name": job.name,
                "status": job.status.value,
                "ended_at": job.ended_at,
                "reason": job.reason,
                "purged_at": now,
            }
            self.tombstones.write(job_id, row)
        job = self.state().jobs.jobs.pop(job_id, None)
        tag = self.keys.job(job_id)
        self.committer.deliver(tag)
        self.committer.retire(tag)
        if self.inboxes.following(job_id):
            self.inboxes.unfollow(job_id)
        snapshots = self.snapshots()
        if snapshots is not None:
            snapshots.forget(job_id)
        forget_deliveries(self.log, tag, self._targets(job))
        delete_tag(self.log, tag)
        done = JobPurged(
            job_id,
            str(row.get("name", "")),
            _status(row),
            row.get("ended_at"),
            int(row["purged_at"]),
            row.get("reason"),
        )
        sends = [(reply_to, done)] if reply_to else []
        envs = self.committer.commit(
            self.tag,
            [done],
            sends=sends,
            consumed=self._consumed(consumed) if consumed is not None else None,
            cause=consumed.envelope.id if consumed is not None else None,
        )
        if envs is not None:
            self.purged.add(job_id)
            self.logger.info("job purged", job=job_id, was=row.get("status"))
        return done


def _status(row: dict[str, Any]) -> Any:
    from sluice.events import JobStatus

    try:
        return JobStatus(row.get("status"))
    except ValueError:
        return JobStatus.FAILED
