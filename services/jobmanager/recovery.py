"""What a new leader does with the jobs it rebuilt from the log before it serves them: their
coordinators restored to their checkpoints and fed what came after, attempts renumbered
above the floor a restart of Redis set, and attempts placed on a registration that is gone
failed. The same for a job rebuilt while the leader already serves, when it joins.

``Restorer`` decides with the jobs core (services/jobs/core.py) and hands each decision to
the jobs' side (services/jobmanager/job_inboxes.py) to commit, as a new leader must: in the
order the log would have had them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from sluice.services.coordination.runtime import JobCoordinators
from sluice.services.jobs import core as jobs
from sluice.services.jobs.state import TERMINAL_JOB, JobRun, JobsState
from sluice.store.shards import keyslot

from .committer import Committer
from .leadership import Rebuilt
from .snapshot import SnapshotWriter
from .state import CurrentState

__all__ = ["Restorer", "JobRestoring"]


class JobRestoring(Protocol):
    """What restoring asks of the jobs' side (services/jobmanager/job_inboxes.py)."""

    def follow(self, job_id: str) -> None: ...

    def create_coordinators(self, job_id: str) -> JobCoordinators: ...

    def commit(self, decision: jobs.Decision) -> None: ...


class Restorer:
    """Built from the leader's state (as it is now), the jobs' side (``jobs_side``), the
    committer (to deliver a joining job's outbox), the jobs' config, and ``mark_restored(job)``
    (a running job's storage marker written if it has none: services/jobmanager/storage_identity.py)."""

    def __init__(
        self,
        state: CurrentState,
        jobs_side: JobRestoring,
        committer: Committer,
        jobs_config: jobs.JobsConfig,
        mark_restored: Callable[[JobRun], None],
    ) -> None:
        self.state, self.jobs, self.committer = state, jobs_side, committer
        self.jobs_config, self.mark_restored = jobs_config, mark_restored

    def join(
        self, job_id: str, r: Rebuilt, now: int, *, snapshots: SnapshotWriter | None, serve: Callable[[str], None]
    ) -> JobRun | None:
        """A job whose rebuild ended while the leader serves: restored and served as a new
        leader's jobs are (``serve(job_id)``: what a previous leader read from its inbox and
        never committed, decided now). Returns the job as rebuilt."""
        coords = self.restore_coordinators(job_id, r)
        self.start_coordinators(job_id, coords, r, now)
        job = r.jobs.jobs.get(job_id)
        self.heard(job_id, job)
        self.renumber(now, job_id)
        self.committer.deliver(self.committer.keys.job(job_id))
        if snapshots is not None:
            snapshots.rebuilt(job_id, r)
        r.tails.pop(job_id, None)
        serve(job_id)
        self.orphans(now, job_id)
        return job

    def restore_coordinators(self, job_id: str, r: Rebuilt) -> JobCoordinators | None:
        """Follow a rebuilt job's inbox (unless it ended) and create its coordinators, reset
        to their checkpoints (bound and started by ``start_coordinators``)."""
        job = r.jobs.jobs.get(job_id)
        if job is None or job.status not in TERMINAL_JOB:  # archived jobs are not followed: loaded when asked about
            self.jobs.follow(job_id)
        if job is not None and job.status not in TERMINAL_JOB:
            self.mark_restored(job)  # (one an older leader accepted has no marker)
        if job is None or not job.built or job.status in TERMINAL_JOB:
            return None
        # Coordinators exist before leadership is used: restored first, then bound and
        # started, then fed what happened after their checkpoints.
        coords = self.jobs.create_coordinators(job_id)
        for op, (cid, cstate, attempts) in r.checkpoints.get(job_id, {}).items():
            coords.restore(op, cid, cstate, attempts)
        return coords

    def start_coordinators(self, job_id: str, coords: JobCoordinators | None, r: Rebuilt, now: int) -> None:
        if coords is not None:
            coords.start(now)
            coords.replay(r.tails.get(job_id, {}))
            self.jobs.commit(jobs.Decision(job_id=job_id, now=now))

    def _jobs(self, only: str | None) -> JobsState:
        """The leader's jobs, or a view of one of them (its run and the shared slot pool)."""
        state = self.state().jobs
        if only is None:
            return state
        run = state.jobs.get(only)
        return JobsState({only: run} if run is not None else {}, state.pool, state.epoch)

    def renumber(self, now: int, only: str | None = None) -> None:
        """Jobs not yet renumbered above the floor they are owed (a restart of Redis, or the
        failover of their tag's shard, that may have lost writes; a leader that died while
        doing this): every unfinished attempt runs again. Jobs on shards that kept their
        writes owe nothing (``Membership.owed_floor`` of their tag's slot)."""
        members = self.state().membership
        state = self._jobs(only)
        owed: dict[int, dict[str, JobRun]] = {}
        for job_id, run in state.jobs.items():
            floor = members.owed_floor(keyslot(self.committer.keys.job(job_id))) if members.restarted else 0
            if floor > run.floor:
                owed.setdefault(floor, {})[job_id] = run
        for floor, runs in sorted(owed.items()):
            restart = jobs.LogRestart(members.restart_reason, floor)
            for d in jobs.decide(JobsState(runs, state.pool, state.epoch), restart, now).jobs:
                self.jobs.commit(d)

    def orphans(self, now: int, only: str | None = None) -> None:
        """Attempts placed on a TaskManager registration that is gone in the cluster's facts
        (the leader died between the two commits, the TaskManager registered again as a new
        session, or it was lost and registered again, under any session, after the attempt
        was placed, whichever leader committed the loss): failed now. Asked at take-over, and
        of each job rebuilt while serving when it joins: a fold of the log either way."""
        members = self.state().membership
        active = {row.resource_id: row.session for row in members.active()}
        registered = {row.resource_id: row.epoch for row in members.active()}
        reasons = {rid: row.reason or "" for rid, row in members.taskmanagers.items()}
        for d in jobs.decide(self._jobs(only), jobs.Orphans(active, reasons, self.jobs_config, registered), now).jobs:
            self.jobs.commit(d)

    def heard(self, job_id: str, job: JobRun | None) -> None:
        """A job that joins while the leader serves: the leader hears of its attempts now
        (older slot reports say nothing of them)."""
        if job is not None:
            for ex in job.executions():
                if ex.taskmanager is not None:
                    self.state().reports.heard(f"{job_id}/{ex.id}")
