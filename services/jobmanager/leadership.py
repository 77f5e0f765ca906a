"""Leadership: the lease, the stall watchdog, and rebuilding the leader's state from the log.

A JobManager leads while it holds the lease. Taking over is a fold of the log: the
cluster's facts (membership, which jobs exist), then each job's facts, each job's tag
fenced before its facts are read so a deposed leader can no longer add to them. The
fold is done a page at a time (``Replay.step``): every page is progress, so a long log
never looks like a stalled main loop, and the lease is renewed all along; a long replay
says how far it got in the log every few seconds.

Snapshots make it short (``SnapshotWriter``): the leader stores each tag's state with the
fact entry id it covers, and a new leader starts from the snapshot and folds only the facts
after it. A job that ended leaves the replay (it is *archived* in the cluster snapshot, and
loaded from its own snapshot when something asks about it: ``restore_job``), so recovery
costs what the live jobs cost, not the history. A snapshot that cannot be read means a full
replay of that tag, with a warning.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sluice.errors import DecodeError
from sluice.events import (
    CoordinatorCheckpointed,
    Envelope,
    Event,
    ExecutionGraphBuilt,
    JobPurged,
    JobRegistered,
    JobSubmitted,
    LeadershipGranted,
    TaskRestartScheduled,
    UpdateTaskExecutionState,
)
from sluice.services.common.world import monotonic_ms
from sluice.services.coordination.runtime import operator_of
from sluice.services.jobs.state import TERMINAL_JOB, JobsState
from sluice.services.jobs.state import evolve as jobs_evolve
from sluice.services.membership.core import Membership
from sluice.services.membership.core import evolve as membership_evolve
from sluice.store import EventLog, LeaderLease, Snapshots, entry_order

from .snapshot import (
    ClusterSnapshot,
    JobSnapshot,
    SnapshotUnreadable,
    decode_cluster,
    decode_job,
    encode_cluster,
    encode_job,
    install_job,
    job_snapshot,
)

if TYPE_CHECKING:
    from .process import JobManager

@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection inside (restored after, whatever happens). A replay
    builds a large state of long-lived objects and little cyclic garbage; the collector's
    full passes over that growing heap took a third of a 10^6-fact replay (19.6 s -> 13.5
    s without them), so each page is folded with the collector off. Between pages the
    objects the replay built are frozen (``gc.freeze``: the collector's passes skip them,
    another tenth of the replay) and unfrozen when it ends, in success or error. A replay
    abandoned midway leaves them frozen until the next one ends: still freed by reference
    counting, only cycles among them wait."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


__all__ = ["Lease", "Replay", "Rebuilt", "Checkpoint", "SnapshotWriter", "restore_job", "load_job",
           "SNAPSHOT_INTERVAL_MS"]

SNAPSHOT_INTERVAL_MS = int(os.environ.get("SLUICE_SNAPSHOT_INTERVAL_MS", "5000"))
"""How often the leader snapshots the tags whose facts grew (a job that ended: at once)."""
_PROGRESS_EVERY_S = 2.0

Checkpoint = tuple[int, Any, "list[int] | None"]
"""A coordinator's last checkpoint: (checkpoint id, state, each subtask's attempt then)."""


class Lease:
    """The leadership lease of one JobManager, and the watchdog that lets it lapse when the
    main loop stops making progress (the fence then refuses what the stalled loop writes)."""

    def __init__(self, log: EventLog, holder: str, ttl_ms: int, max_stall_s: float,
                 monotonic: Callable[[], float]) -> None:
        self.lease = LeaderLease(log, holder, ttl_ms)
        self.ttl_ms, self.max_stall_s, self._monotonic = ttl_ms, max_stall_s, monotonic
        self._progress = monotonic()
        self.lost = False

    def progress(self) -> None:
        """The main loop did something (a read, a page of replay): it is alive."""
        self._progress = self._monotonic()

    def try_acquire(self, server: str) -> int | None:
        epoch = self.lease.try_acquire()
        if epoch is not None:
            self.lease.server = server
            self.lost = False
            self.progress()
        return epoch

    def renew(self) -> str | None:
        """Keep the lease; the reason it is lost (None while it is held)."""
        if self.lease.epoch is None:
            return "not leading"
        stalled = self._monotonic() - self._progress
        if stalled > self.max_stall_s:
            self.lost = True
            self.lease.epoch = None
            return f"main loop stalled for {stalled:.1f} s (limit {self.max_stall_s:.1f} s): letting the lease lapse"
        if not self.lease.renew():
            self.lost = True
            return "the lease is gone (expired and taken, or the server restarted)"
        return None

    def release(self) -> None:
        self.lease.release()

    @property
    def epoch(self) -> int | None:
        return self.lease.epoch


@dataclass
class Rebuilt:
    """The leader's state as the log has it."""

    membership: Membership = field(default_factory=Membership)
    jobs: JobsState = field(default_factory=JobsState)
    registered: list[str] = field(default_factory=list)
    """Every job ever registered, in order (an id stays taken after its job ended)."""
    archived: list[str] = field(default_factory=list)
    """Registered jobs that ended and left the replay (not in ``jobs``: see restore_job)."""
    purged: list[str] = field(default_factory=list)
    """Registered jobs purged (``JobPurged``): their keys are gone, their ids stay taken."""
    checkpoints: dict[str, dict[str, Checkpoint]] = field(default_factory=dict)
    """Per job and coordinator, the last checkpoint."""
    tails: dict[str, dict[str, list[Event]]] = field(default_factory=dict)
    """Per job and coordinator, the facts it was fed after its last checkpoint."""
    last_grant: LeadershipGranted | None = None
    facts: int = 0
    from_snapshots: int = 0
    """Tags whose replay started from a snapshot."""
    positions: dict[str, str] = field(default_factory=dict)
    """Per live job, the last fact entry id folded in."""

    @property
    def live(self) -> list[str]:
        """Registered jobs the replay folded (all but the archived and the purged), in order."""
        gone = set(self.archived) | set(self.purged)
        return [j for j in self.registered if j not in gone]


def _fold_job(jobs: JobsState, job_id: str, page: list[tuple[str, Envelope]], checkpoints: dict[str, Checkpoint],
              tails: dict[str, list[Event]]) -> None:
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


def read_snapshot(log: EventLog, tag: str, decode: Callable[[bytes], Any],
                  warn: Callable[..., None] | None) -> tuple[str, Any] | None:
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


class Replay:
    """Rebuild from the log one page per ``step`` (True when every live job is rebuilt):
    the cluster's facts first, then each live job in turn. ``fence(tag)`` is called for
    each job's tag before its snapshot and facts are read. With ``snapshots`` each tag
    starts from its snapshot, and archived jobs are skipped.

    Each job is folded into a state of its own and installed into ``result.jobs`` whole,
    when its last page is folded (``take_rebuilt`` says which were, since it was last
    asked): a leader that serves while the rest are rebuilt (``ready``) never sees a job
    half folded. ``serve_after_s``: once the cluster's facts are folded and the rebuild
    has taken this long, ``ready`` is True though jobs are left (None: only when all
    are rebuilt)."""

    def __init__(self, log: EventLog, fence: Callable[[str], None], *, page: int = 1000, snapshots: bool = True,
                 logger: Any = None, monotonic: Callable[[], float] | None = None,
                 serve_after_s: float | None = None, freeze_gc: bool = True) -> None:
        self.log, self.fence, self.page = log, fence, page
        self.freeze_gc = freeze_gc
        """Freeze what each page built (``gc.freeze``). Off where many JobManagers share one
        process (the simulation): a freeze is process-wide, it resets the collector's
        allocation count, and one replay's freezes every step left the collector idle while
        every other JobManager's cyclic garbage piled up (13 GB in a pytest run of seeds)."""
        self.snapshots = snapshots
        self.logger, self._monotonic = logger, monotonic
        self.serve_after_s = serve_after_s
        self.result = Rebuilt()
        self._cluster: Iterator[None] | None = self._run_cluster()
        self.pending: list[str] = []
        """Live jobs not yet rebuilt, in the order they will be (known once the cluster's
        facts are folded)."""
        self._current: tuple[str, Iterator[None]] | None = None
        self._rebuilt: list[str] = []
        self.done = False
        self.jobs_done = 0
        self._started = monotonic() if monotonic is not None else 0.0
        self._said = self._started

    def ready(self) -> bool:
        """Whether a leader may serve now: every job is rebuilt, or the cluster's facts are
        and the rebuild has gone on for ``serve_after_s`` (the rest is rebuilt while it serves)."""
        if self.done:
            return True
        if self._cluster is not None or self.serve_after_s is None or self._monotonic is None:
            return False
        return self._monotonic() - self._started >= self.serve_after_s

    def recovering(self, job_id: str) -> bool:
        """Whether ``job_id`` is a live job still to be rebuilt."""
        return job_id in self.pending

    def take_rebuilt(self) -> list[str]:
        """Jobs installed into ``result.jobs`` since the last call, in order."""
        out, self._rebuilt = self._rebuilt, []
        return out

    def step(self) -> bool:
        if self.done:
            return True
        try:
            with gc_paused():
                self._advance()
                if not self.done and self.freeze_gc:
                    gc.freeze()  # what the replay built so far is long-lived: later passes skip it
        except BaseException:
            if self.freeze_gc:
                gc.unfreeze()
            raise
        if self.done and self.freeze_gc:
            gc.unfreeze()
        elif self.logger is not None and self._monotonic is not None:
            now = self._monotonic()
            if now - self._said >= _PROGRESS_EVERY_S:  # a long replay is progress, not a stall: say so
                self._said = now
                r = self.result
                self.logger.info("replaying the log", facts=r.facts, jobs=f"{self.jobs_done}/{len(r.live)}",
                                 archived=len(r.archived), from_snapshots=r.from_snapshots,
                                 seconds=round(now - self._started, 1))
        return self.done

    def _advance(self) -> None:
        """One page: of the cluster's facts, or of the job being rebuilt."""
        if self._cluster is not None:
            try:
                next(self._cluster)
                return
            except StopIteration:
                self._cluster = None
                self.pending = list(self.result.live)
        if self._current is None:
            if not self.pending:
                self.done = True
                return
            job_id = self.pending[0]
            self._current = (job_id, self._run_job(job_id))
        job_id, steps = self._current
        try:
            next(steps)
        except StopIteration:
            self._ended(job_id)

    def rebuild_now(self, job_id: str, progress: Callable[[], None] | None = None) -> None:
        """Rebuild ``job_id`` to its end at once (a message about it cannot wait);
        ``progress()`` is called after each page (the stall watchdog)."""
        if job_id not in self.pending:
            return
        steps = self._current[1] if self._current is not None and self._current[0] == job_id else self._run_job(job_id)
        with gc_paused():
            for _ in steps:
                if progress is not None:
                    progress()
        self._ended(job_id)
        if self.done and self.freeze_gc:
            gc.unfreeze()

    def _ended(self, job_id: str) -> None:
        """``job_id``'s rebuild ended (installed by ``_run_job``): it is no longer pending."""
        if self._current is not None and self._current[0] == job_id:
            self._current = None
        self.pending.remove(job_id)
        self.done = not self.pending and self._cluster is None

    def _warn(self, what: str, **kw: Any) -> None:
        if self.logger is not None:
            self.logger.warning(what, **kw)

    def _pages(self, stream: str, after: str = "0-0") -> Iterator[list[tuple[str, Envelope]]]:
        """The stream's envelopes after ``after`` a page at a time (decoded like ``EventLog.replay``)."""
        return self.log.replay_pages(stream, after, page=self.page)

    def _run_cluster(self) -> Iterator[None]:
        r = self.result
        keys = self.log.keys
        after = "0-0"
        if self.snapshots:
            got = read_snapshot(self.log, keys.cluster, decode_cluster, self._warn)
            if got is not None:
                after, c = got
                r.membership, r.registered, r.last_grant = c.membership, list(c.registered), c.last_grant
                r.archived = list(c.archived)
                r.purged = list(c.purged)
                r.from_snapshots += 1
            yield
        for page in self._pages(keys.facts(keys.cluster), after):
            for _, env in page:
                membership_evolve(r.membership, env)
                ev = env.event
                if isinstance(ev, JobRegistered):
                    r.registered.append(ev.job_id)
                elif isinstance(ev, JobPurged):  # its keys are gone: no replay looks for it
                    r.purged.append(ev.job_id)
                    if ev.job_id in r.archived:
                        r.archived.remove(ev.job_id)
                elif isinstance(ev, LeadershipGranted):
                    r.last_grant = ev
            r.facts += len(page)
            yield

    def _run_job(self, job_id: str) -> Iterator[None]:
        """One job, a page per step, folded into a state of its own and installed at its end."""
        r = self.result
        self.fence(self.log.keys.job(job_id))  # from now on a deposed leader cannot write to this job

        def folded(facts: int, from_snapshot: bool) -> None:
            r.facts += facts
            r.from_snapshots += from_snapshot

        snap, after = yield from _rebuild_job(self.log, job_id, snapshots=self.snapshots, warn=self._warn,
                                              page=self.page, folded=folded)
        install_job(r.jobs, JobSnapshot(job_id, snap.run, snap.pool, {}, {}))
        r.positions[job_id] = after
        if snap.run is not None and snap.run.status not in TERMINAL_JOB:  # an ended job has no coordinators
            r.checkpoints[job_id] = snap.checkpoints
            r.tails[job_id] = snap.tails
        self.jobs_done += 1
        self._rebuilt.append(job_id)


def _rebuild_job(log: EventLog, job_id: str, *, snapshots: bool, warn: Callable[..., None] | None, page: int = 1000,
                 folded: Callable[[int, bool], None] | None = None) -> Generator[None, None, tuple[JobSnapshot, str]]:
    """One job's state as its log has it, a page per step (its snapshot, when usable, and
    the facts after it), in a state of its own; returns it with the last entry id folded.
    ``folded(facts, from_snapshot)`` is told as it goes."""
    tag = log.keys.job(job_id)
    own = JobsState()
    checkpoints: dict[str, Checkpoint] = {}
    tails: dict[str, list[Event]] = {}
    after = "0-0"
    if snapshots:
        got = read_snapshot(log, tag, functools.partial(decode_job, job_id=job_id), warn)
        if got is not None:
            after, snap = got
            install_job(own, snap)
            checkpoints, tails = snap.checkpoints, snap.tails
            if folded is not None:
                folded(0, True)
    for facts in log.replay_pages(log.keys.facts(tag), after, page=page):
        _fold_job(own, job_id, facts, checkpoints, tails)
        after = facts[-1][0]
        if folded is not None:
            folded(len(facts), False)
        yield
    return job_snapshot(own, job_id, checkpoints, tails), after


def load_job(log: EventLog, job_id: str, *, snapshots: bool = True,
             warn: Callable[..., None] | None = None) -> JobSnapshot:
    """One job's state as its log has it: its snapshot (when usable) and the facts after it."""
    steps = _rebuild_job(log, job_id, snapshots=snapshots, warn=warn)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            snap: JobSnapshot = done.value[0]
            return snap


def restore_job(jm: JobManager, job_id: str) -> bool:
    """Bring an archived job (ended, left out of the replay) back into the leader's state,
    for a message about it (``sluice job dispose``); whether it is there now. Its tag is
    fenced first, as the replay fences a live job's."""
    if jm.replay is not None and jm.leading and jm.replay.recovering(job_id):
        jm.recover_now(job_id)  # a live job not yet rebuilt: at once
    if job_id in jm.state.jobs.jobs:
        return True
    if job_id not in jm.registered or job_id in jm.purged or jm.epoch is None:
        return False  # (a purged job's tag must not be written again: not even its fence)
    jm.committer.fence(jm.keys.job(job_id))
    snap = load_job(jm.log, job_id, warn=jm.logger.warning)
    if snap.run is None:
        return False
    install_job(jm.state.jobs, snap)
    jm.logger.info("archived job loaded", job=job_id, status=snap.run.status.value)
    return True


class SnapshotWriter:
    """The leader's snapshots: every ``interval_ms`` each tag whose facts grew since its last
    snapshot, and at once a job that ended (then archived: left out of later replays and
    dropped from memory). Written through the fenced ``snapshot`` script: a deposed leader's
    write is refused (StaleEpoch, and it steps down)."""

    def __init__(self, jm: JobManager, r: Rebuilt, grant: LeadershipGranted | None,
                 interval_ms: int = SNAPSHOT_INTERVAL_MS) -> None:
        self.jm, self.interval_ms = jm, interval_ms
        self.store = Snapshots(jm.log)
        self.order = list(r.registered)
        self.archived = list(r.archived)
        self.last_grant = grant
        self.lengths: dict[str, int] = {}
        """Per tag, the length of its fact stream at its last snapshot."""
        self.trails: dict[str, CoordinatorTrail] = {}
        for j in r.live:
            self.rebuilt(j, r)
        self.next_due = 0
        self.written = 0

    def rebuilt(self, job_id: str, r: Rebuilt) -> None:
        """A live job the replay has rebuilt: its snapshots start from where the replay ended."""
        if job_id in r.jobs.jobs:
            self.trails[job_id] = CoordinatorTrail.of(r.jobs, job_id, r.positions.get(job_id, "0-0"),
                                                      r.checkpoints.get(job_id, {}), r.tails.get(job_id, {}))

    def committed(self, tag: str, facts: list[tuple[str, Envelope]]) -> None:
        """Facts this leader just committed to ``tag``: a job's trail folds them at once, so
        its next snapshot need not read them back from the log (a big job's facts made the
        writer a quarter of the leader's work). A job's trail starts at its first fact; a
        trail that cannot take them is dropped, and the next snapshot replays the job."""
        job_id = self.jm.keys.job_id_of(tag)
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
            self.jm.logger.warning("snapshot trail dropped", job=job_id, error=str(exc)[:300])
            self.trails.pop(job_id, None)

    def forget(self, job_id: str) -> None:
        """A purged job: in no archive, with no trail."""
        self.trails.pop(job_id, None)
        if job_id in self.archived:
            self.archived.remove(job_id)

    def _registered(self) -> list[str]:
        known = set(self.order)
        self.order += sorted(j for j in self.jm.registered if j not in known)
        return self.order

    def _write(self, tag: str, data: bytes) -> str:
        jm = self.jm
        assert jm.committer.epoch is not None
        pos = self.store.write(tag, jm.committer.epoch, data, server=jm.committer.server)
        self.written += 1
        return pos

    def _job(self, job_id: str) -> bool:
        jm = self.jm
        tag = jm.keys.job(job_id)
        trail = self.trails.get(job_id)
        if trail is None:
            trail = self.trails[job_id] = CoordinatorTrail()
        for entry_id, env in jm.log.replay(jm.keys.facts(tag), trail.pos):  # what the leader wrote since
            trail.fold(entry_id, env)
        trail.fed = True  # up to the log's end now: every later commit is fed to it (``committed``)
        ended = jm.state.jobs.jobs[job_id].status in TERMINAL_JOB  # an ended job has no coordinators to restore
        try:
            data = encode_job(job_snapshot(jm.state.jobs, job_id, {} if ended else trail.checkpoints,
                                           {} if ended else trail.tails))
        except (TypeError, ValueError) as exc:  # orjson: a value it cannot encode (a bug; replay still works)
            jm.logger.warning("job snapshot not written", job=job_id, error=str(exc)[:300])
            return False
        pos = self._write(tag, data)
        if pos != trail.pos:  # only this leader appends to the tag: never; if it did, replay this job in full
            jm.logger.warning("job snapshot does not match its log; dropped", job=job_id, pos=pos, read=trail.pos)
            self.store.delete(tag)
            self.trails.pop(job_id, None)
            return False
        self.lengths[tag] = jm.log.length(jm.keys.facts(tag))
        return True

    def _cluster(self) -> None:
        jm = self.jm
        snap = ClusterSnapshot(jm.state.membership, self._registered(), self.last_grant, self.archived,
                               sorted(jm.purged))
        try:
            data = encode_cluster(snap)
        except (TypeError, ValueError) as exc:
            jm.logger.warning("cluster snapshot not written", error=str(exc)[:300])
            return
        self._write(jm.tag, data)
        self.lengths[jm.tag] = jm.log.length(jm.keys.facts(jm.tag))

    def tick(self, now: int) -> None:
        jm = self.jm
        ended = [j for j, job in jm.state.jobs.jobs.items()
                 if job.status in TERMINAL_JOB and j not in jm.state.coords and not _holds_slots(jm.state.jobs, j)]
        archived = [j for j in ended if self._job(j)]
        if archived:
            jm.retention.release(archived)  # before the archive is recorded: done again if we die here
            self.archived += [j for j in archived if j not in self.archived]
            self._cluster()
            for j in archived:  # in its snapshot and in the archive: it leaves the leader's memory
                del jm.state.jobs.jobs[j]
                self.trails.pop(j, None)
                self.lengths.pop(jm.keys.job(j), None)
                jm.committer.retire(jm.keys.job(j))
            jm.logger.info("jobs archived", jobs=len(archived), archived=len(self.archived))
        clock = monotonic_ms(jm.world)  # (the schedule: a wall-clock step back would put snapshots off)
        if clock < self.next_due:
            return
        self.next_due = clock + self.interval_ms
        for job_id in list(jm.state.jobs.jobs):
            tag = jm.keys.job(job_id)
            if jm.log.length(jm.keys.facts(tag)) != self.lengths.get(tag):
                self._job(job_id)
        if jm.log.length(jm.keys.facts(jm.tag)) != self.lengths.get(jm.tag) or archived:
            self._cluster()


def _holds_slots(state: JobsState, job_id: str) -> bool:
    return state.pool.holds(job_id)  # (an index: this is asked of every ended job at every tick)


@dataclass
class CoordinatorTrail:
    """A live job's coordinators' last checkpoints and the facts fed to them since, as the
    replay finds them (``_fold_job``), kept up to date from the job's facts after ``pos``:
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
    def of(cls, state: JobsState, job_id: str, pos: str, checkpoints: dict[str, Checkpoint],
           tails: dict[str, list[Event]]) -> CoordinatorTrail:
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
