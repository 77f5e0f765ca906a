"""Leadership: the lease, the stall watchdog, and rebuilding the leader's state from the log.

A JobManager leads while it holds the lease. Taking over is a fold of the log: the
cluster's facts (membership, which jobs exist), then each job's facts, each job's tag
fenced before its facts are read so a deposed leader can no longer add to them. The
fold is done a page at a time (``Replay.step``): every page is progress, so a long log
never looks like a stalled main loop, and the lease is renewed all along.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sluice.events import CoordinatorCheckpointed, Event, JobRegistered, LeadershipGranted
from sluice.services.coordination.runtime import operator_of
from sluice.services.jobs.state import TERMINAL_JOB, JobsState
from sluice.services.jobs.state import evolve as jobs_evolve
from sluice.services.membership.core import Membership
from sluice.services.membership.core import evolve as membership_evolve
from sluice.store import EventLog, LeaderLease

__all__ = ["Lease", "Replay", "Rebuilt", "Checkpoint"]

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
    checkpoints: dict[str, dict[str, Checkpoint]] = field(default_factory=dict)
    """Per job and coordinator, the last checkpoint."""
    tails: dict[str, dict[str, list[Event]]] = field(default_factory=dict)
    """Per job and coordinator, the facts it was fed after its last checkpoint."""
    last_grant: LeadershipGranted | None = None
    facts: int = 0


class Replay:
    """Rebuild from the log one page per ``step`` (True when done); ``fence(tag)`` is
    called for each job's tag before its facts are read."""

    def __init__(self, log: EventLog, fence: Callable[[str], None], *, page: int = 1000) -> None:
        self.log, self.fence, self.page = log, fence, page
        self.result = Rebuilt()
        self._steps: Iterator[None] = self._run()
        self.done = False

    def step(self) -> bool:
        if self.done:
            return True
        try:
            next(self._steps)
        except StopIteration:
            self.done = True
        return self.done

    def _pages(self, stream: str) -> Iterator[list[tuple[str, Any]]]:
        """The stream's envelopes a page at a time (decoded like ``EventLog.replay``)."""
        after = "0-0"
        while True:
            page = []
            for entry_id, env in self.log.replay(stream, after, page=self.page):
                page.append((entry_id, env))
                if len(page) >= self.page:
                    break
            if page:
                yield page
                after = page[-1][0]
            if len(page) < self.page:
                return

    def _run(self) -> Iterator[None]:
        r = self.result
        keys = self.log.keys
        for page in self._pages(keys.facts(keys.cluster)):
            for _, env in page:
                membership_evolve(r.membership, env)
                ev = env.event
                if isinstance(ev, JobRegistered):
                    r.registered.append(ev.job_id)
                elif isinstance(ev, LeadershipGranted):
                    r.last_grant = ev
            r.facts += len(page)
            yield
        for job_id in r.registered:
            tag = keys.job(job_id)
            self.fence(tag)  # from now on a deposed leader cannot write to this job
            checkpoints: dict[str, Checkpoint] = {}
            tails: dict[str, list[Event]] = {}
            for page in self._pages(keys.facts(tag)):
                for _, env in page:
                    jobs_evolve(r.jobs, env)
                    op = operator_of(env.event)
                    if op is None:
                        continue
                    if isinstance(env.event, CoordinatorCheckpointed):
                        run = r.jobs.jobs[job_id].vertices.get(op)
                        attempts = [ex.attempt for ex in run.subtasks] if run else None
                        checkpoints[op] = (env.event.checkpoint_id, env.event.state, attempts)
                        tails[op] = []
                    else:
                        tails.setdefault(op, []).append(env.event)
                r.facts += len(page)
                yield
            job = r.jobs.jobs.get(job_id)
            if job is not None and job.status not in TERMINAL_JOB:  # an ended job has no coordinators to restore
                r.checkpoints[job_id] = checkpoints
                r.tails[job_id] = tails
            yield
