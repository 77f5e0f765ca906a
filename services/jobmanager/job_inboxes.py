"""Job inboxes: each job's messages decided by the jobs core, its coordinators fed, its
tasks scheduled onto free slots, and every decision committed on the job's own tag.

A job's messages in one read are decided in order and committed together (one group
commit per job and batch), with what its coordinators did in answer, in one script.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from sluice.errors import DuplicateCommit, HandlerFailed, MessageRejected
from sluice.events import (
    Event,
    ExecutionGraphBuilt,
    JobRefused,
    SubmitJob,
    TaskOperationResult,
    TaskRestartScheduled,
    TaskState,
    UpdateTaskExecutionState,
)
from sluice.services.common.decision import Address, Checkpoint, Deliver, FailJob, Send
from sluice.services.common.world import World, monotonic_ms
from sluice.services.coordination.runtime import JobCoordinators
from sluice.services.jobs import core as jobs
from sluice.services.jobs import reconcile
from sluice.services.jobs.machine import LIVE_JOB, TERMINAL_JOB
from sluice.services.jobs.speculation import Speculate
from sluice.store import Blobs, Consumed, GroupConsumer, Keys, tag_of
from sluice.store.consumer import Entry

from .cluster import plan_splits
from .committer import Committer
from .kvstate import retired_state
from .state import CurrentState

__all__ = ["JobInboxes", "HandlerFailed", "DuplicateCommit"]


class _Scheduled(NamedTuple):
    decision: jobs.Decision | None
    free: jobs.FreeSlots | None


def _merge(into: jobs.Decision, decision: jobs.Decision | None) -> None:
    into.merge(decision)


class JobInboxes:
    """Built from the leader's state (``state()``: as it is now), the committer, the keys,
    the world, the jobs' config, a logger, the reader of the inboxes (``consumer()``: as it
    is now; ``batch``: how many entries one read takes), which jobs are still being rebuilt
    (``recovering``), and what the coordinators need (the storage root, the blobs holding a
    job's code, the checkpoint interval, an executor)."""

    def __init__(
        self,
        *,
        state: CurrentState,
        committer: Committer,
        keys: Keys,
        world: World,
        jobs_config: jobs.JobsConfig,
        logger: Any,
        consumer: Callable[[], GroupConsumer],
        group: str,
        batch: int,
        recovering: Callable[[], list[str]],
        storage_root: str,
        blobs: Blobs,
        checkpoint_interval_ms: int,
        coordinator_executor: Callable[[str], Any] | None,
    ) -> None:
        self.state, self.committer, self.keys, self.world = state, committer, keys, world
        self.jobs_config, self.logger, self.consumer, self.group = jobs_config, logger, consumer, group
        self.batch, self.recovering, self.storage_root, self.blobs = batch, recovering, storage_root, blobs
        self.checkpoint_interval_ms, self.coordinator_executor = checkpoint_interval_ms, coordinator_executor
        self._next_deploy_check = 0
        self._next_speculation_check = 0

    # --- which inboxes are read ---
    def follow(self, job_id: str) -> None:
        self.consumer().add_stream(self.keys.inbox(self.keys.job(job_id)))

    def following(self, job_id: str) -> bool:
        return self.keys.inbox(self.keys.job(job_id)) in self.consumer().streams

    def unfollow(self, job_id: str) -> None:
        self.consumer().remove_stream(self.keys.inbox(self.keys.job(job_id)))

    # --- messages ---
    def handle(self, stream: str, entries: list[Entry]) -> None:
        """One job's entries of a batch: decided in order, committed together, all at one
        time: the deciders fold their facts into the live state with the time they are
        given, and the commit stamps every fact with the decision's, so a fact decided at
        another moment than the batch's would make the leader's state differ from the log's."""
        job_id = self.keys.job_id_of(tag_of(stream))
        assert job_id is not None
        now = self.world.now_ms()
        merged = jobs.Decision(job_id=job_id, now=now)
        done: list[str] = []
        for entry in entries:
            try:
                decision = self._decide(job_id, entry, now)
            except MessageRejected as exc:
                self.committer.park(entry, exc.kind, str(exc))
                continue
            except Exception as exc:
                raise HandlerFailed(entry, exc) from exc
            if decision.rejected is not None:
                self.committer.park(entry, decision.rejected.kind, str(decision.rejected))
                continue
            _merge(merged, decision)
            self._restarts_seen(decision.facts)  # before the batch's scheduling pass looks at them
            done.append(entry.id)
        if done:
            # What the messages freed or made ready is scheduled in the same commit (one
            # script a batch, not two); schedule_all still looks at every job afterwards.
            _merge(merged, self._schedule(job_id, now=now).decision)
            self.commit(merged, stream, tuple(done))

    def _decide(self, job_id: str, entry: Entry, now: int) -> jobs.Decision:
        state = self.state()
        env = entry.envelope
        if isinstance(env.event, SubmitJob):
            if job_id in state.jobs.jobs:
                return jobs.Decision(job_id=job_id, now=now)  # already accepted: a redelivery
            try:
                splits = plan_splits(env.event)
            except Exception as exc:
                return jobs.Decision(
                    sends=[Send(Address.client(env.event.reply_to), JobRefused(job_id, str(exc)))],
                    job_id=job_id,
                    now=now,
                )
            self.logger.info(
                "job submitted",
                job=job_id,
                name=env.event.graph.name,
                subtasks=sum(v.parallelism for v in env.event.graph.vertices),
            )
            return jobs.decide(
                state.jobs, jobs.Submit(env.event, splits, self.storage_root, state.membership.attempt_floor), now
            )
        if isinstance(env.event, (UpdateTaskExecutionState, TaskOperationResult)):
            state.reports.heard(f"{job_id}/{env.event.execution_id}")  # for reconciliation
        decision = jobs.decide(state.jobs, jobs.Inbound(job_id, env, self.jobs_config), now)
        if decision.note:
            self.logger.debug("job message", job=job_id, note=decision.note)
        return decision

    # --- committing ---
    def commit(self, decision: jobs.Decision, stream: str | None = None, entry_ids: tuple[str, ...] = ()) -> None:
        """Commit a job decision, acknowledging ``entry_ids`` of the job's inbox, with what the
        job's coordinators did in answer to its facts (in the same script)."""
        tag = self.keys.job(decision.job_id)
        deliver = self._coordinate(decision)
        if not decision.facts and not decision.sends and not entry_ids:
            return
        sends = []
        inboxes: dict[str, str] = {}  # a deployment pass sends a thousand messages to a few TaskManagers
        for to, ev in decision.sends:
            if to.kind == "taskmanager":
                target = inboxes.get(to.name)
                if target is None:
                    target = inboxes[to.name] = self.keys.inbox(self.keys.taskmanager(to.name))
            else:
                target = to.name
            sends.append((target, ev))
        consumed = Consumed(stream, self.group, entry_ids) if stream and entry_ids else None
        # One decision, one script: its facts and its messages land together or not at all
        # (deployments are capped per pass, so a script stays short).
        envs = self.committer.commit(
            tag, decision.facts, sends=sends, consumed=consumed, deliver_to=deliver, now=decision.now
        )
        if envs is None:
            raise DuplicateCommit(f"a job commit for {decision.job_id} was a duplicate")
        state = self.state()
        clock = monotonic_ms(self.world)  # deadlines count from here, on this process's clock (services/jobs/timers.py)
        for ev in decision.facts:  # a slot report says something of a deployment only once sent after it
            if isinstance(ev, UpdateTaskExecutionState) and ev.state == TaskState.DEPLOYING:
                state.reports.heard(f"{decision.job_id}/{ev.execution_id}")
                state.reports.deployed[f"{decision.job_id}/{ev.execution_id}"] = clock
        self._restarts_seen(decision.facts)
        coords = state.coords.get(decision.job_id)
        if coords is not None:
            coords.committed()
        retired = retired_state(decision.facts)
        if retired:  # queryable state of attempts that ended: no longer served
            self.committer.retire_state(decision.job_id, retired)
        job = state.jobs.jobs.get(decision.job_id)
        if job is not None and job.status in TERMINAL_JOB:
            if coords is not None:
                coords.close()
                del state.coords[decision.job_id]
            if self.following(decision.job_id):
                self.unfollow(decision.job_id)
                self.logger.info("job ended", job=decision.job_id, status=job.status.value, reason=job.reason)

    def _restarts_seen(self, facts: list[Event]) -> None:
        """Restarts this leader decided: their delays count from now, on its clock (a
        scheduling pass may look at them before they are committed)."""
        clock = None
        for ev in facts:
            if isinstance(ev, TaskRestartScheduled):
                clock = monotonic_ms(self.world) if clock is None else clock
                self.state().timers.restart_seen(ev.job_id, ev.vertex_id, ev.subtask, ev.attempt, clock)

    def accept_lost_finals(self) -> None:
        """Final states from slot reports whose own reports are lost (services/jobs/reconcile.py):
        judged right after a read's messages were handled, on what that read saw."""
        counts = self.consumer().read_counts

        def caught_up(job_id: str) -> bool:
            return counts.get(self.keys.inbox(self.keys.job(job_id)), 0) < self.batch

        state = self.state()
        reports = state.reports
        for d in reconcile.decide(
            state.jobs, reconcile.LostFinals(reports, caught_up, self.jobs_config), self.world.now_ms()
        ).jobs:
            self.commit(d)
        for task_id in reports.accepted:
            self.logger.warning("a final state taken from a slot report: its own report was lost", task=task_id)
        reports.accepted.clear()

    # --- scheduling and time ---
    def schedule_all(self) -> None:
        if self.recovering():  # the slots the jobs still being rebuilt hold are not known yet
            return
        free: jobs.FreeSlots | None = None
        for job_id in list(self.state().jobs.jobs):
            decision = self._schedule(job_id, free)
            free = decision.free
            if decision.decision:
                self.commit(decision.decision)

    def _schedule(self, job_id: str, free: jobs.FreeSlots | None = None, *, now: int | None = None) -> _Scheduled:
        """The job's ready tasks placed on free slots (``free``: what is left of the slots
        after the jobs before it in this pass, None to look them up), decided at ``now``
        (the batch's, when merged into its decision; None: the clock's)."""
        state = self.state()
        job = state.jobs.jobs.get(job_id)
        if self.recovering() or job is None or not job.ready or job.status not in LIVE_JOB:
            return _Scheduled(None, free)
        free = free if free is not None else self._free_slots()
        if job.waiting_since is not None and not any(free.values()):
            return _Scheduled(None, free)  # already waiting for slots and none is free: nothing to try
        sessions = {r.resource_id: r.session for r in state.membership.active()}
        at = self.world.now_ms() if now is None else now
        return _Scheduled(
            jobs.decide(state.jobs, jobs.Schedule(job_id, free, sessions, state.timers, monotonic_ms(self.world)), at),
            free,
        )

    def _free_slots(self) -> jobs.FreeSlots:
        state = self.state()
        used = state.jobs.pool.by_taskmanager
        return {
            r.resource_id: [s for s in range(r.slots) if s not in used.get(r.resource_id, ())]
            for r in sorted(state.membership.active(), key=lambda r: r.resource_id)
        }

    def tick(self, now: int) -> None:
        """Deadlines (slot waits, deployments) at ``now`` (the wall clock: their facts' time),
        measured on the monotonic clock (services/jobs/timers.py)."""
        state = self.state()
        clock = monotonic_ms(self.world)
        total = sum(r.slots for r in state.membership.active())
        if not self.recovering():  # no waiting for slots times out while nothing can be scheduled, nor for that time
            for d in jobs.decide(
                state.jobs, jobs.SlotWaits(self.jobs_config, total, timers=state.timers, clock=clock), now
            ).jobs:
                self.commit(d)
        self._speculate(now, clock)
        reports = state.reports
        if clock >= self._next_deploy_check:  # once a second is plenty for a timeout of a minute
            self._next_deploy_check = clock + 1000
            for d in reconcile.decide(
                state.jobs,
                reconcile.DeploymentTimeouts(
                    reports, self.jobs_config.deploy_timeout_ms, self.jobs_config, clock=clock
                ),
                now,
            ).jobs:
                self.logger.warning("deployment timed out", job=d.job_id, facts=len(d.facts))
                self.commit(d)
        self.flush_coordinators(now)

    def _speculate(self, now: int, clock: int) -> None:
        """Speculative execution, when it is on: every check interval (a second, as Flink's
        slow-task-detector's), each running job's slow subtasks get a speculative attempt
        (services/jobs/speculation.py); the next scheduling pass places them."""
        config = self.jobs_config.speculation
        if not config.enabled or self.recovering() or clock < self._next_speculation_check:
            return
        self._next_speculation_check = clock + config.check_interval_ms
        state = self.state()
        free = self._free_slots()
        for job_id, job in list(state.jobs.jobs.items()):
            if job.status in LIVE_JOB:
                decision = jobs.decide(state.jobs, Speculate(job_id, config, free), now)
                if decision.facts:
                    self.logger.info("speculative attempts", job=job_id, facts=len(decision.facts))
                    self.commit(decision)

    # --- coordinators ---
    def create_coordinators(self, job_id: str) -> JobCoordinators:
        state = self.state()
        job = state.jobs.jobs[job_id]
        coords = JobCoordinators(
            job_id,
            job.graph.vertices,
            job.splits,
            self._loader(job_id),
            interval_ms=self.checkpoint_interval_ms,
            executor=self.coordinator_executor,
            monotonic=self.world.monotonic,
        )
        state.coords[job_id] = coords
        return coords

    def _loader(self, job_id: str) -> Any:
        """Imports a user coordinator class (``module:qualname``) from the job's code."""
        state, blobs = self.state, self.blobs

        def load(ref: str) -> type:
            import importlib
            import tempfile
            from pathlib import Path

            from sluice.services.taskmanager.library import LibraryCache, load_module

            job = state().jobs.jobs[job_id]
            module_name, _, qualname = ref.partition(":")
            if module_name == job.module:
                cache = LibraryCache(blobs, Path(tempfile.gettempdir()) / "sluice-jobmanager-code")
                obj: object = load_module(cache.register(job.code_blob, job.module), job.module)
            else:
                obj = importlib.import_module(module_name)
            for part in qualname.split("."):
                obj = getattr(obj, part)
            # (whatever the user's ref names: JobCoordinators calls it as a coordinator class,
            # and what fails there fails the job)
            return obj  # type: ignore[return-value]

        return load

    def _coordinate(self, decision: jobs.Decision) -> dict[int, str]:
        """Feed the decision's facts to the job's coordinators (creating them with the
        ExecutionGraph) and append what they did; returns which facts are also delivered
        to a subtask's inbox (fact index -> inbox key)."""
        state = self.state()
        job_id, now = decision.job_id, decision.now
        coords = state.coords.get(job_id)
        for ev in list(decision.facts):
            if isinstance(ev, ExecutionGraphBuilt) and coords is None:
                coords = self.create_coordinators(job_id)
                coords.start(now)
            elif coords is not None:
                coords.feed(ev)
        if coords is None:
            return {}
        job = state.jobs.jobs.get(job_id)
        ending = job is not None and job.status in TERMINAL_JOB  # a last checkpoint keeps the final state
        flush = coords.flush(now, force=bool(decision.of(Checkpoint)) or ending)
        if flush.of(FailJob):
            reason = "\n".join(f.reason for f in flush.of(FailJob))
            failed = jobs.decide(state.jobs, jobs.FailAtOnce(job_id, reason), now)
            if failed.facts:  # a failed coordinator stays failed: say so once, when the job fails
                self.logger.error("coordinator failed; failing the job", job=job_id, reason=reason.splitlines()[0])
            for ev in failed.facts:
                coords.feed(ev)
            decision.facts += failed.facts
            decision.sends += failed.sends
        tag = self.keys.job(job_id)
        deliver: dict[int, str] = {}
        for d in flush.of(Deliver):
            deliver[len(decision.facts) + d.fact] = self.keys.task_inbox(tag, d.to.vertex, d.to.subtask)
        decision.facts += flush.facts
        return deliver

    def close_coordinators(self) -> None:
        state = self.state()
        for coords in state.coords.values():
            coords.close()
        state.coords = {}

    def flush_coordinators(self, now: int) -> None:
        """Periodic checkpoints, and what coordinator threads did since the last pass."""
        for job_id in list(self.state().coords):
            self.commit(jobs.Decision(job_id=job_id, now=now))
