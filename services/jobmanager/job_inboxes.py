"""Job inboxes: each job's messages decided by the jobs core, its coordinators fed, its
tasks scheduled onto free slots, and every decision committed on the job's own tag.

A job's messages in one read are decided in order and committed together (one group
commit per job and batch), with what its coordinators did in answer, in one script.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from sluice.errors import DuplicateCommit, HandlerFailed, MessageRejected
from sluice.events import (
    ExecutionGraphBuilt,
    JobRefused,
    SubmitJob,
    TaskOperationResult,
    TaskRestartScheduled,
    TaskState,
    UpdateTaskExecutionState,
)
from sluice.services.common.world import monotonic_ms
from sluice.services.coordination.runtime import JobCoordinators
from sluice.services.jobs import core as jobs
from sluice.services.jobs.machine import LIVE_JOB, TERMINAL_JOB
from sluice.services.jobs.reconcile import accept_lost_finals, deployment_timeouts
from sluice.store import Consumed, tag_of
from sluice.store.consumer import Entry

from .cluster import plan_splits
from .kvstate import retired_state

if TYPE_CHECKING:
    from .process import JobManager

__all__ = ["JobInboxes", "HandlerFailed", "DuplicateCommit"]


class _Scheduled(NamedTuple):
    decision: jobs.Decision | None
    free: jobs.FreeSlots | None


def _merge(into: jobs.Decision, decision: jobs.Decision | None) -> None:
    if decision is not None:
        assert decision.now == into.now, "a merged decision was decided at another time than its batch"
        into.facts += decision.facts
        into.sends += decision.sends
        into.checkpoint |= decision.checkpoint


class JobInboxes:
    def __init__(self, jm: JobManager) -> None:
        self.jm = jm
        self._next_deploy_check = 0

    # --- which inboxes are read ---
    def follow(self, job_id: str) -> None:
        self.jm.consumer.add_stream(self.jm.keys.inbox(self.jm.keys.job(job_id)))

    def following(self, job_id: str) -> bool:
        return self.jm.keys.inbox(self.jm.keys.job(job_id)) in self.jm.consumer.streams

    def unfollow(self, job_id: str) -> None:
        self.jm.consumer.remove_stream(self.jm.keys.inbox(self.jm.keys.job(job_id)))

    # --- messages ---
    def handle(self, stream: str, entries: list[Entry]) -> None:
        """One job's entries of a batch: decided in order, committed together, all at one
        time: the deciders fold their facts into the live state with the time they are
        given, and the commit stamps every fact with the decision's, so a fact decided at
        another moment than the batch's would make the leader's state differ from the log's."""
        jm = self.jm
        job_id = jm.keys.job_id_of(tag_of(stream))
        assert job_id is not None
        now = jm.world.now_ms()
        merged = jobs.Decision(job_id, now)
        done: list[str] = []
        for entry in entries:
            try:
                decision = self._decide(job_id, entry, now)
            except MessageRejected as exc:
                jm.committer.park(entry, exc.kind, str(exc))
                continue
            except Exception as exc:
                raise HandlerFailed(entry, exc) from exc
            _merge(merged, decision)
            self._restarts_seen(decision.facts)  # before the batch's scheduling pass looks at them
            done.append(entry.id)
        if done:
            # What the messages freed or made ready is scheduled in the same commit (one
            # script a batch, not two); schedule_all still looks at every job afterwards.
            _merge(merged, self._schedule(job_id, now=now).decision)
            self.commit(merged, stream, tuple(done))

    def _decide(self, job_id: str, entry: Entry, now: int) -> jobs.Decision:
        jm = self.jm
        env = entry.envelope
        if isinstance(env.event, SubmitJob):
            if job_id in jm.state.jobs.jobs:
                return jobs.Decision(job_id, now)  # already accepted: a redelivery
            try:
                splits = plan_splits(env.event)
            except Exception as exc:
                return jobs.Decision(job_id, now, sends=[(("inbox", env.event.reply_to), JobRefused(job_id, str(exc)))])
            jm.logger.info("job submitted", job=job_id, name=env.event.graph.name,
                           subtasks=sum(v.parallelism for v in env.event.graph.vertices))
            return jobs.submit(jm.state.jobs, env.event, splits, jm.storage_root, now,
                               jm.state.membership.attempt_floor)
        if isinstance(env.event, (UpdateTaskExecutionState, TaskOperationResult)):
            jm.state.reports.heard(f"{job_id}/{env.event.execution_id}")  # for reconciliation
        decision = jobs.on_message(jm.state.jobs, job_id, env, jm.jobs_config, now)
        if decision.note:
            jm.logger.debug("job message", job=job_id, note=decision.note)
        return decision

    # --- committing ---
    def commit(self, decision: jobs.Decision, stream: str | None = None, entry_ids: tuple[str, ...] = ()) -> None:
        """Commit a job decision, acknowledging ``entry_ids`` of the job's inbox, with what the
        job's coordinators did in answer to its facts (in the same script)."""
        jm = self.jm
        tag = jm.keys.job(decision.job_id)
        deliver = self._coordinate(decision)
        if not decision.facts and not decision.sends and not entry_ids:
            return
        sends = []
        inboxes: dict[str, str] = {}  # a deployment pass sends a thousand messages to a few TaskManagers
        for (kind, where), ev in decision.sends:
            if kind == "tm":
                target = inboxes.get(where)
                if target is None:
                    target = inboxes[where] = jm.keys.inbox(jm.keys.taskmanager(where))
            else:
                target = where
            sends.append((target, ev))
        consumed = Consumed(stream, jm.group, entry_ids) if stream and entry_ids else None
        # One decision, one script: its facts and its messages land together or not at all
        # (deployments are capped per pass, so a script stays short).
        envs = jm.committer.commit(tag, decision.facts, sends=sends, consumed=consumed, deliver_to=deliver,
                                   now=decision.now)
        if envs is None:
            raise DuplicateCommit(f"a job commit for {decision.job_id} was a duplicate")
        clock = monotonic_ms(jm.world)  # deadlines count from here, on this process's clock (services/jobs/timers.py)
        for ev in decision.facts:  # a slot report says something of a deployment only once sent after it
            if isinstance(ev, UpdateTaskExecutionState) and ev.state == TaskState.DEPLOYING:
                jm.state.reports.heard(f"{decision.job_id}/{ev.execution_id}")
                jm.state.reports.deployed[f"{decision.job_id}/{ev.execution_id}"] = clock
        self._restarts_seen(decision.facts)
        coords = jm.state.coords.get(decision.job_id)
        if coords is not None:
            coords.committed()
        retired = retired_state(decision.facts)
        if retired:  # queryable state of attempts that ended: no longer served
            jm.committer.retire_state(decision.job_id, retired)
        job = jm.state.jobs.jobs.get(decision.job_id)
        if job is not None and job.status in TERMINAL_JOB:
            if coords is not None:
                coords.close()
                del jm.state.coords[decision.job_id]
            if self.following(decision.job_id):
                self.unfollow(decision.job_id)
                jm.logger.info("job ended", job=decision.job_id, status=job.status.value, reason=job.reason)

    def _restarts_seen(self, facts: list) -> None:
        """Restarts this leader decided: their delays count from now, on its clock (a
        scheduling pass may look at them before they are committed)."""
        clock = None
        for ev in facts:
            if isinstance(ev, TaskRestartScheduled):
                clock = monotonic_ms(self.jm.world) if clock is None else clock
                self.jm.state.timers.restart_seen(ev.job_id, ev.vertex_id, ev.subtask, ev.attempt, clock)

    def accept_lost_finals(self) -> None:
        """Final states from slot reports whose own reports are lost (services/jobs/reconcile.py):
        judged right after a read's messages were handled, on what that read saw."""
        jm = self.jm
        counts = jm.consumer.read_counts

        def caught_up(job_id: str) -> bool:
            return counts.get(jm.keys.inbox(jm.keys.job(job_id)), 0) < jm.batch

        reports = jm.state.reports
        for d in accept_lost_finals(jm.state.jobs, reports, caught_up, jm.world.now_ms(), jm.jobs_config):
            self.commit(d)
        for task_id in reports.accepted:
            jm.logger.warning("a final state taken from a slot report: its own report was lost", task=task_id)
        reports.accepted.clear()

    # --- scheduling and time ---
    def schedule_all(self) -> None:
        if self.jm.recovering:  # the slots the jobs still being rebuilt hold are not known yet
            return
        free: jobs.FreeSlots | None = None
        for job_id in list(self.jm.state.jobs.jobs):
            decision = self._schedule(job_id, free)
            free = decision.free
            if decision.decision:
                self.commit(decision.decision)

    def _schedule(self, job_id: str, free: jobs.FreeSlots | None = None, *, now: int | None = None) -> _Scheduled:
        """The job's ready tasks placed on free slots (``free``: what is left of the slots
        after the jobs before it in this pass, None to look them up), decided at ``now``
        (the batch's, when merged into its decision; None: the clock's)."""
        jm = self.jm
        job = jm.state.jobs.jobs.get(job_id)
        if jm.recovering or job is None or not job.ready or job.status not in LIVE_JOB:
            return _Scheduled(None, free)
        free = free if free is not None else self._free_slots()
        if job.waiting_since is not None and not any(free.values()):
            return _Scheduled(None, free)  # already waiting for slots and none is free: nothing to try
        sessions = {r.resource_id: r.session for r in jm.state.membership.active()}
        at = jm.world.now_ms() if now is None else now
        return _Scheduled(jobs.schedule(jm.state.jobs, job_id, free, at, sessions, timers=jm.state.timers,
                                        clock=monotonic_ms(jm.world)), free)

    def _free_slots(self) -> jobs.FreeSlots:
        used = self.jm.state.jobs.pool.by_tm
        return {r.resource_id: [s for s in range(r.slots) if s not in used.get(r.resource_id, ())]
                for r in sorted(self.jm.state.membership.active(), key=lambda r: r.resource_id)}

    def tick(self, now: int) -> None:
        """Deadlines (slot waits, deployments) at ``now`` (the wall clock: their facts' time),
        measured on the monotonic clock (services/jobs/timers.py)."""
        jm = self.jm
        clock = monotonic_ms(jm.world)
        total = sum(r.slots for r in jm.state.membership.active())
        if not jm.recovering:  # no waiting for slots times out while nothing can be scheduled, nor for that time
            for d in jobs.tick(jm.state.jobs, jm.jobs_config, now, total, timers=jm.state.timers, clock=clock):
                self.commit(d)
        reports = jm.state.reports
        if clock >= self._next_deploy_check:  # once a second is plenty for a timeout of a minute
            self._next_deploy_check = clock + 1000
            for d in deployment_timeouts(jm.state.jobs, reports, now, jm.jobs_config.deploy_timeout_ms,
                                         jm.jobs_config, clock=clock):
                jm.logger.warning("deployment timed out", job=d.job_id, facts=len(d.facts))
                self.commit(d)
        self.flush_coordinators(now)

    # --- coordinators ---
    def create_coordinators(self, job_id: str) -> JobCoordinators:
        jm = self.jm
        job = jm.state.jobs.jobs[job_id]
        coords = JobCoordinators(job_id, job.graph.vertices, job.splits, self._loader(job_id),
                                 interval_ms=jm.checkpoint_interval_ms, executor=jm.coordinator_executor,
                                 monotonic=jm.world.monotonic)
        jm.state.coords[job_id] = coords
        return coords

    def _loader(self, job_id: str) -> Any:
        """Imports a user coordinator class (``module:qualname``) from the job's code."""
        jm = self.jm

        def load(ref: str) -> type:
            import importlib
            import tempfile
            from pathlib import Path

            from sluice.services.taskmanager.library import LibraryCache, load_module

            job = jm.state.jobs.jobs[job_id]
            module_name, _, qualname = ref.partition(":")
            if module_name == job.module:
                cache = LibraryCache(jm.blobs, Path(tempfile.gettempdir()) / "sluice-jobmanager-code")
                obj: object = load_module(cache.register(job.code_blob, job.module), job.module)
            else:
                obj = importlib.import_module(module_name)
            for part in qualname.split("."):
                obj = getattr(obj, part)
            return obj  # type: ignore[return-value]

        return load

    def _coordinate(self, decision: jobs.Decision) -> dict[int, str]:
        """Feed the decision's facts to the job's coordinators (creating them with the
        ExecutionGraph) and append what they did; returns which facts are also delivered
        to a subtask's inbox (fact index -> inbox key)."""
        jm = self.jm
        job_id, now = decision.job_id, decision.now
        coords = jm.state.coords.get(job_id)
        for ev in list(decision.facts):
            if isinstance(ev, ExecutionGraphBuilt) and coords is None:
                coords = self.create_coordinators(job_id)
                coords.start(now)
            elif coords is not None:
                coords.feed(ev)
        if coords is None:
            return {}
        job = jm.state.jobs.jobs.get(job_id)
        ending = job is not None and job.status in TERMINAL_JOB  # a last checkpoint keeps the final state
        flush = coords.flush(now, force=decision.checkpoint or ending)
        if flush.failures:
            reason = "\n".join(flush.failures)
            failed = jobs.fail_job(jm.state.jobs, job_id, reason, now)
            if failed.facts:  # a failed coordinator stays failed: say so once, when the job fails
                jm.logger.error("coordinator failed; failing the job", job=job_id, reason=reason.splitlines()[0])
            for ev in failed.facts:
                coords.feed(ev)
            decision.facts += failed.facts
            decision.sends += failed.sends
        tag = jm.keys.job(job_id)
        deliver: dict[int, str] = {}
        for ev, to in flush.facts:
            if to is not None:
                deliver[len(decision.facts)] = jm.keys.task_inbox(tag, to[0], to[1])
            decision.facts.append(ev)
        return deliver

    def close_coordinators(self) -> None:
        for coords in self.jm.state.coords.values():
            coords.close()
        self.jm.state.coords = {}

    def flush_coordinators(self, now: int) -> None:
        """Periodic checkpoints, and what coordinator threads did since the last pass."""
        for job_id in list(self.jm.state.coords):
            self.commit(jobs.Decision(job_id, now))
