"""Leadership: the lease, the stall watchdog, and rebuilding the leader's state from the log.

A JobManager leads while it holds the lease. Taking over is a fold of the log: the
cluster's facts (membership, which jobs exist), then each job's facts, each job's tag
fenced before its facts are read so a deposed leader can no longer add to them. The
fold is done a page at a time (``Replay.step``): every page is progress, so a long log
never looks like a stalled main loop, and the lease is renewed all along; a long replay
says how far it got in the log every few seconds.

Snapshots make it short (``SnapshotWriter``, services/jobmanager/snapshot.py): the leader
stores each tag's state with the fact entry id it covers, and a new leader starts from the
snapshot and folds only the facts after it. A job that ended leaves the replay (it is
*archived* in the cluster snapshot, and loaded from its own snapshot when something asks
about it: ``Archive.restore_job``), so recovery costs what the live jobs cost, not the history. A snapshot that cannot be read means a full
replay of that tag, with a warning.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sluice.events import Envelope, Event, JobPurged, JobRegistered, LeadershipGranted
from sluice.services.jobs.state import TERMINAL_JOB, JobsState
from sluice.services.membership.core import Membership
from sluice.services.membership.core import evolve as membership_evolve
from sluice.store import EventLog, LeaderLease

from .snapshot import Checkpoint, read_snapshot, rebuild_job
from .snapshot_codec import JobSnapshot, decode_cluster, install_job


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


__all__ = ["Lease", "Replay", "Rebuilt", "gc_paused"]

_PROGRESS_EVERY_S = 2.0


class Lease:
    """The leadership lease of one JobManager, and the watchdog that lets it lapse when the
    main loop stops making progress (the fence then refuses what the stalled loop writes)."""

    def __init__(
        self, log: EventLog, holder: str, ttl_ms: int, max_stall_s: float, monotonic: Callable[[], float]
    ) -> None:
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
    """Registered jobs that ended and left the replay (not in ``jobs``: see Archive.restore_job)."""
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
    found: dict[str, str] = field(default_factory=dict)
    """Jobs whose own facts exist but whose registration the cluster's tag lost (a failover
    of its shard: services/jobmanager/restarts.py ``reconcile``), with their names: in
    ``registered``, and registered again at take-over."""

    @property
    def live(self) -> list[str]:
        """Registered jobs the replay folded (all but the archived and the purged), in order."""
        gone = set(self.archived) | set(self.purged)
        return [j for j in self.registered if j not in gone]


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

    def __init__(
        self,
        log: EventLog,
        fence: Callable[[str], None],
        *,
        page: int = 1000,
        snapshots: bool = True,
        logger: Any = None,
        monotonic: Callable[[], float] | None = None,
        serve_after_s: float | None = None,
        freeze_gc: bool = True,
        reconcile: Callable[[Rebuilt], None] | None = None,
    ) -> None:
        self.log, self.fence, self.page = log, fence, page
        self.reconcile = reconcile
        """Called with the result once the cluster's facts are folded, before the jobs are
        (on a sharded log: what a failover of one shard cut across tags)."""
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
                self.logger.info(
                    "replaying the log",
                    facts=r.facts,
                    jobs=f"{self.jobs_done}/{len(r.live)}",
                    archived=len(r.archived),
                    from_snapshots=r.from_snapshots,
                    seconds=round(now - self._started, 1),
                )
        return self.done

    def _advance(self) -> None:
        """One page: of the cluster's facts, or of the job being rebuilt."""
        if self._cluster is not None:
            try:
                next(self._cluster)
                return
            except StopIteration:
                self._cluster = None
                if self.reconcile is not None:
                    self.reconcile(self.result)
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

        snap, after = yield from rebuild_job(
            self.log, job_id, snapshots=self.snapshots, warn=self._warn, page=self.page, folded=folded
        )
        install_job(r.jobs, JobSnapshot(job_id, snap.run, snap.pool, {}, {}))
        r.positions[job_id] = after
        if snap.run is not None and snap.run.status not in TERMINAL_JOB:  # an ended job has no coordinators
            r.checkpoints[job_id] = snap.checkpoints
            r.tails[job_id] = snap.tails
        self.jobs_done += 1
        self._rebuilt.append(job_id)
