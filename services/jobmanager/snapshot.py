"""The leader's snapshots: writing them, reading them back, and the jobs they archive.

* ``SnapshotWriter``: every interval, each tag whose facts grew; at once, a job that ended
  (then archived: left out of later replays and dropped from the leader's memory);
* ``CoordinatorTrail``: a live job's coordinators' checkpoints and tails, kept up to date
  from its facts, so a job snapshot need not read them back from the log;
* ``load_job`` and ``Archive.restore_job``: one job's state from its snapshot and the
  facts after it (an archived job brought back for a message about it);
* ``read_snapshot`` and ``rebuild_job``: what the replay (services/jobmanager/leadership.py)
  starts each tag from.

What a snapshot holds, and its encoding, are in services/jobmanager/snapshot_codec.py.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sluice.errors import DecodeError
from sluice.events import (
    CoordinatorCheckpointed,
    Envelope,
    Event,
    ExecutionGraphBuilt,
    JobSubmitted,
    LeadershipGranted,
    TaskRestartScheduled,
    UpdateTaskExecutionState,
)
from sluice.services.common.world import World, monotonic_ms
from sluice.services.coordination.runtime import operator_of
from sluice.services.jobs.state import TERMINAL_JOB, JobsState
from sluice.services.jobs.state import evolve as jobs_evolve
from sluice.store import EventLog, Snapshots, entry_order

from . import snapshot_codec as codec
from .committer import Committer
from .snapshot_codec import Checkpoint, JobSnapshot, SnapshotUnreadable, install_job, job_snapshot
from .state import CurrentState

if TYPE_CHECKING:
    from .leadership import Rebuilt

__all__ = [
    "SnapshotWriter",
    "CoordinatorTrail",
    "Archive",
    "Checkpoint",
    "load_job",
    "read_snapshot",
    "rebuild_job",
    "fold_job",
    "SNAPSHOT_INTERVAL_MS",
]

SNAPSHOT_INTERVAL_MS = int(os.environ.get("SLUICE_SNAPSHOT_INTERVAL_MS", "5000"))
"""How often the leader snapshots the tags whose facts grew (a job that ended: at once)."""


def snapshot_interval_ms() -> int:
    """$SLUICE_SNAPSHOT_INTERVAL_MS now (sluice.config checks it at start), else 5000."""
    return int(os.environ.get("SLUICE_SNAPSHOT_INTERVAL_MS") or "5000")


# --- reading ---------------------------------------------------------------------------------


def fold_job(
    jobs: JobsState,
    job_id: str,
    page: list[tuple[str, Envelope]],
    checkpoints: dict[str, Checkpoint],
    tails: dict[str, list[Event]],
) -> None:
    """A page of a job's facts: into the jobs state, and its coordinators' checkpoints and
    tails (one loop, its names local: replay runs it for every fact)."""
    for _, env in page:
        jobs_evolve(jobs, env)
        ev = env.event
        op = ev.vertex_id if type(ev) is UpdateTaskExecutionState else operator_of(ev)
        if op is None:
            continue
        if type(ev) is CoordinatorCheckpointed:
            run = jobs.jobs[job_id].vertices.get(op)
            attempts = [ex.attempt for ex in run.subtasks] if run else None
            checkpoints[op] = (ev.checkpoint_id, ev.state, attempts)
            tails[op] = []
        else:
            tail = tails.get(op)
            if tail is None:
                tail = tails[op] = []
            tail.append(ev)


def read_snapshot(
    log: EventLog, tag: str, decode: Callable[[bytes], Any], warn: Callable[..., None] | None
) -> tuple[str, Any] | None:
    """(position, decoded snapshot) of ``tag``, or None when there is none or it cannot be
    used (then ``warn`` is told why, and the tag is replayed in full)."""
    stored = Snapshots(log).read(tag)
    if stored is None:
        return None
    try:
        snap = decode(stored.data)
        entry_order(stored.position)
        last = log.last_id(log.keys.facts(tag)) or "0-0"
        if entry_order(stored.position) > entry_order(last):
            raise SnapshotUnreadable(f"it covers facts up to {stored.position}, but the log ends at {last}")
    except (SnapshotUnreadable, ValueError, DecodeError) as exc:  # (an event in it of a later version)
        if warn is not None:
            warn("snapshot unreadable; replaying the log in full", tag=tag, error=str(exc)[:300])
        return None
    return stored.position, snap


def rebuild_job(
    log: EventLog,
    job_id: str,
    *,
    snapshots: bool,
    warn: Callable[..., None] | None,
    page: int = 1000,
    folded: Callable[[int, bool], None] | None = None,
) -> Generator[None, None, tuple[JobSnapshot, str]]:
    """One job's state as its log has it, a page per step (its snapshot, when usable, and
    the facts after it), in a state of its own; returns it with the last entry id folded.
    ``folded(facts, from_snapshot)`` is told as it goes."""
    tag = log.keys.job(job_id)
    own = JobsState()
    checkpoints: dict[str, Checkpoint] = {}
    tails: dict[str, list[Event]] = {}
    after = "0-0"
    if snapshots:
        got = read_snapshot(log, tag, functools.partial(codec.decode_job, job_id=job_id), warn)
        if got is not None:
            after, snap = got
            install_job(own, snap)
            checkpoints, tails = snap.checkpoints, snap.tails
            if folded is not None:
                folded(0, True)
    for facts in log.replay_pages(log.keys.facts(tag), after, page=page):
        fold_job(own, job_id, facts, checkpoints, tails)
        after = facts[-1][0]
        if folded is not None:
            folded(len(facts), False)
        yield
    return job_snapshot(own, job_id, checkpoints, tails), after


def load_job(
    log: EventLog, job_id: str, *, snapshots: bool = True, warn: Callable[..., None] | None = None
) -> JobSnapshot:
    """One job's state as its log has it: its snapshot (when usable) and the facts after it."""
    steps = rebuild_job(log, job_id, snapshots=snapshots, warn=warn)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            snap: JobSnapshot = done.value[0]
            return snap


class Archive:
    """The jobs that ended and left the leader's memory (archived in the cluster snapshot),
    brought back one at a time for a message about them. Built from the log, the committer
    (to fence the job's tag), the leader's state (as it is now), the ids of the jobs
    registered and purged, a logger, and ``recover(job_id)``: the leader's rebuild, at once,
    of a live job it is still recovering (nothing when it is not)."""

    def __init__(
        self,
        log: EventLog,
        committer: Committer,
        state: CurrentState,
        registered: set[str],
        purged: set[str],
        logger: Any,
        recover: Callable[[str], None],
    ) -> None:
        self.log, self.committer, self.state, self.logger = log, committer, state, logger
        self.registered, self.purged, self.recover = registered, purged, recover

    def restore_job(self, job_id: str) -> bool:
        """Bring an archived job (ended, left out of the replay) back into the leader's state,
        for a message about it (``sluice job dispose``); whether it is there now. Its tag is
        fenced first, as the replay fences a live job's."""
        self.recover(job_id)  # a live job not yet rebuilt: at once
        if job_id in self.state().jobs.jobs:
            return True
        if job_id not in self.registered or job_id in self.purged or self.committer.epoch is None:
            return False  # (a purged job's tag must not be written again: not even its fence)
        self.committer.fence(self.log.keys.job(job_id))
        snap = load_job(self.log, job_id, warn=self.logger.warning)
        if snap.run is None:
            return False
        install_job(self.state().jobs, snap)
        self.logger.info("archived job loaded", job=job_id, status=snap.run.status.value)
        return True


# --- writing ---------------------------------------------------------------------------------


class SnapshotWriter:
    """The leader's snapshots: every ``interval_ms`` each tag whose facts grew since its last
    snapshot, and at once a job that ended (then archived: left out of later replays and
    dropped from memory). Written through the fenced ``snapshot`` script: a deposed leader's
    write is refused (StaleEpoch, and it steps down).

    Built from the log, the committer (its epoch and server; it retires an archived job's
    tag), the leader's state (as it is now), the ids of the jobs registered and purged, the
    world (its clock), a logger, ``release(job_ids)`` (an archived job's transport keys:
    services/jobmanager/retention.py), and the rebuild it starts from."""

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
        release: Callable[[Sequence[str]], None],
        rebuilt: Rebuilt,
        grant: LeadershipGranted | None,
        interval_ms: int | None = None,
    ) -> None:
        self.log, self.keys, self.committer, self.state = log, log.keys, committer, state
        self.registered, self.purged, self.world, self.logger = registered, purged, world, logger
        # None: $SLUICE_SNAPSHOT_INTERVAL_MS as it is now (the CLI puts a flag's or the settings
        # file's value there after this module was imported), else the default.
        self.release = release
        self.interval_ms = interval_ms if interval_ms is not None else snapshot_interval_ms()
        self.tag = self.keys.cluster
        self.store = Snapshots(log)
        self.order = list(rebuilt.registered)
        self.archived = list(rebuilt.archived)
        self.last_grant = grant
        self.lengths: dict[str, int] = {}
        """Per tag, the length of its fact stream at its last snapshot."""
        self.trails: dict[str, CoordinatorTrail] = {}
        for j in rebuilt.live:
            self.rebuilt(j, rebuilt)
        self.next_due = 0
        self.written = 0

    def rebuilt(self, job_id: str, r: Rebuilt) -> None:
        """A live job the replay has rebuilt: its snapshots start from where the replay ended."""
        if job_id in r.jobs.jobs:
            self.trails[job_id] = CoordinatorTrail.of(
                r.jobs, job_id, r.positions.get(job_id, "0-0"), r.checkpoints.get(job_id, {}), r.tails.get(job_id, {})
            )

    def committed(self, tag: str, facts: list[tuple[str, Envelope]]) -> None:
        """Facts this leader just committed to ``tag``: a job's trail folds them at once, so
        its next snapshot need not read them back from the log (a big job's facts made the
        writer a quarter of the leader's work). A job's trail starts at its first fact; a
        trail that cannot take them is dropped, and the next snapshot replays the job."""
        job_id = self.keys.job_id_of(tag)
        if job_id is None or not facts:
            return
        trail = self.trails.get(job_id)
        if trail is None:
            if type(facts[0][1].event) is not JobSubmitted:
                return  # the next snapshot replays the job from its start
            trail = self.trails[job_id] = CoordinatorTrail(fed=True)
        elif not trail.fed:
            return  # facts may have been committed since its position: the next snapshot reads them
        try:
            for entry_id, env in facts:
                trail.fold(entry_id, env)
        except Exception as exc:  # a bug: the snapshot replays the job instead
            self.logger.warning("snapshot trail dropped", job=job_id, error=str(exc)[:300])
            self.trails.pop(job_id, None)

    def forget(self, job_id: str) -> None:
        """A purged job: in no archive, with no trail."""
        self.trails.pop(job_id, None)
        if job_id in self.archived:
            self.archived.remove(job_id)

    def _registered(self) -> list[str]:
        known = set(self.order)
        self.order += sorted(j for j in self.registered if j not in known)
        return self.order

    def _write(self, tag: str, data: bytes) -> str:
        assert self.committer.epoch is not None
        pos = self.store.write(tag, self.committer.epoch, data, server=self.committer.server)
        self.written += 1
        return pos

    def _job(self, job_id: str) -> bool:
        keys, log, jobs = self.keys, self.log, self.state().jobs
        tag = keys.job(job_id)
        trail = self.trails.get(job_id)
        if trail is None:
            trail = self.trails[job_id] = CoordinatorTrail()
        for entry_id, env in log.replay(keys.facts(tag), trail.pos):  # what the leader wrote since
            trail.fold(entry_id, env)
        trail.fed = True  # up to the log's end now: every later commit is fed to it (``committed``)
        ended = jobs.jobs[job_id].status in TERMINAL_JOB  # an ended job has no coordinators to restore
        try:
            data = codec.encode_job(
                job_snapshot(jobs, job_id, {} if ended else trail.checkpoints, {} if ended else trail.tails)
            )
        except (TypeError, ValueError) as exc:  # orjson: a value it cannot encode (a bug; replay still works)
            self.logger.warning("job snapshot not written", job=job_id, error=str(exc)[:300])
            return False
        pos = self._write(tag, data)
        if pos != trail.pos:  # only this leader appends to the tag: never; if it did, replay this job in full
            self.logger.warning("job snapshot does not match its log; dropped", job=job_id, pos=pos, read=trail.pos)
            self.store.delete(tag)
            self.trails.pop(job_id, None)
            return False
        self.lengths[tag] = log.length(keys.facts(tag))
        return True

    def _cluster(self) -> None:
        snap = codec.ClusterSnapshot(
            self.state().membership, self._registered(), self.last_grant, self.archived, sorted(self.purged)
        )
        try:
            data = codec.encode_cluster(snap)
        except (TypeError, ValueError) as exc:
            self.logger.warning("cluster snapshot not written", error=str(exc)[:300])
            return
        self._write(self.tag, data)
        self.lengths[self.tag] = self.log.length(self.keys.facts(self.tag))

    def tick(self, now: int) -> None:
        keys, log, state = self.keys, self.log, self.state()
        ended = [
            j
            for j, job in state.jobs.jobs.items()
            if job.status in TERMINAL_JOB and j not in state.coords and not _holds_slots(state.jobs, j)
        ]
        archived = [j for j in ended if self._job(j)]
        if archived:
            self.release(archived)  # before the archive is recorded: done again if we die here
            self.archived += [j for j in archived if j not in self.archived]
            self._cluster()
            for j in archived:  # in its snapshot and in the archive: it leaves the leader's memory
                del state.jobs.jobs[j]
                self.trails.pop(j, None)
                self.lengths.pop(keys.job(j), None)
                self.committer.retire(keys.job(j))
            self.logger.info("jobs archived", jobs=len(archived), archived=len(self.archived))
        clock = monotonic_ms(self.world)  # (the schedule: a wall-clock step back would put snapshots off)
        if clock < self.next_due:
            return
        self.next_due = clock + self.interval_ms
        for job_id in list(state.jobs.jobs):
            tag = keys.job(job_id)
            if log.length(keys.facts(tag)) != self.lengths.get(tag):
                self._job(job_id)
        if log.length(keys.facts(self.tag)) != self.lengths.get(self.tag) or archived:
            self._cluster()


def _holds_slots(state: JobsState, job_id: str) -> bool:
    return state.pool.holds(job_id)  # (an index: this is asked of every ended job at every tick)


@dataclass
class CoordinatorTrail:
    """A live job's coordinators' last checkpoints and the facts fed to them since, as the
    replay finds them (``fold_job``), kept up to date from the job's facts after ``pos``:
    what a job snapshot stores for them. Only the subtasks' attempt numbers are followed
    besides (a checkpoint records them), not the whole job."""

    pos: str = "0-0"
    checkpoints: dict[str, Checkpoint] = field(default_factory=dict)
    tails: dict[str, list[Event]] = field(default_factory=dict)
    parallelism: dict[str, int] = field(default_factory=dict)
    attempts: dict[str, list[int]] = field(default_factory=dict)
    fed: bool = False
    """Whether it holds every fact up to the log's end, so commits may be folded as they
    are made; False when it comes from a replay (facts may have been committed since)."""

    @classmethod
    def of(
        cls, state: JobsState, job_id: str, pos: str, checkpoints: dict[str, Checkpoint], tails: dict[str, list[Event]]
    ) -> CoordinatorTrail:
        job = state.jobs.get(job_id)
        trail = cls(pos, dict(checkpoints), {op: list(evs) for op, evs in tails.items()})
        if job is not None:
            trail.parallelism = {v.name: v.parallelism for v in job.graph.vertices}
            trail.attempts = {name: [ex.attempt for ex in v.subtasks] for name, v in job.vertices.items()}
        return trail

    def fold(self, entry_id: str, env: Envelope) -> None:
        ev = env.event
        if type(ev) is JobSubmitted:
            self.parallelism = {v.name: v.parallelism for v in ev.graph.vertices}
        elif type(ev) is ExecutionGraphBuilt:
            self.attempts = {name: [ev.first_attempt] * p for name, p in self.parallelism.items()}
        elif type(ev) is TaskRestartScheduled:
            self.attempts[ev.vertex_id][ev.subtask] = ev.attempt
        op = operator_of(ev)
        if op is not None:
            if isinstance(ev, CoordinatorCheckpointed):
                attempts = self.attempts.get(op)
                self.checkpoints[op] = (ev.checkpoint_id, ev.state, list(attempts) if attempts is not None else None)
                self.tails[op] = []
            else:
                self.tails.setdefault(op, []).append(ev)
        self.pos = entry_id
