"""The cluster inbox: TaskManagers joining, beating and leaving; jobs submitted, disposed and purged.

Membership is decided by its pure core (services/membership/core.py); this part turns a
message into a commit on the cluster's tag, keeps the heartbeat monitor, and decides
timeouts only once the inbox has been read to its end (heartbeats waiting in a backlog
after a stall are heard before anyone is declared lost).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, cast

from sluice.errors import MessageRejected
from sluice.events import (
    DisposeJob,
    Envelope,
    Event,
    JobRefused,
    JobRegistered,
    PurgeJob,
    RegisterTaskManager,
    SubmitJob,
    TaskManagerHeartbeat,
    TaskManagerLost,
    TaskManagerUnregistered,
    TaskStatesRecorded,
)
from sluice.events.ids import id_problem
from sluice.services.common import job_marker
from sluice.services.common.decision import Recorded
from sluice.services.common.shell import hostname
from sluice.services.common.world import World
from sluice.services.common.world import monotonic_ms as monotonic_ms  # (a seam: tools/sim/plants.py replaces it)
from sluice.services.dataplane import spark_reach
from sluice.services.jobs import core as jobs
from sluice.services.jobs import reconcile as reconciliation
from sluice.services.jobs.validate import broadcast_size_problems, broadcast_sizes_known, problems
from sluice.services.membership.core import Inbound, MembershipConfig, Timeouts, decide, evolve
from sluice.store import Blobs, Consumed, Keys
from sluice.store.consumer import Entry

from .committer import Committer
from .state import CurrentState
from .storage_identity import StorageIdentity

__all__ = ["ClusterInbox", "JobOperations", "TimeoutGate", "plan_splits"]


class JobOperations(Protocol):
    """What the cluster inbox asks of the jobs' side (services/jobmanager/job_inboxes.py):
    commit a job's decision, and follow a job's inbox."""

    def commit(self, decision: jobs.Decision) -> None: ...

    def follow(self, job_id: str) -> None: ...

    def following(self, job_id: str) -> bool: ...


def plan_splits(msg: SubmitJob) -> dict[str, list[Any]]:
    """Each source's split enumerator discovers its splits (a missing input refuses the job)."""
    from sluice.services.coordination.source import discover

    return {
        v.name: discover(v.source.format, v.source.paths, v.source.split_bytes, v.source.options, v.parallelism)
        for v in msg.graph.vertices
        if v.source is not None
    }


def broadcast_sizes(msg: SubmitJob) -> dict[str, int]:
    """The bytes of each broadcast producer whose size is known before it runs (a Parquet
    source read whole: its files), to refuse one above the job's limit at submission."""
    from sluice.services.dataplane.splits import list_input_files

    sizes = {}
    for v in broadcast_sizes_known(msg.graph):
        assert v.source is not None  # (broadcast_sizes_known gives sources only)
        sizes[v.name] = sum(f.size or 0 for f in list_input_files(v.source.paths))
    return sizes


class ClusterInbox:
    """Built from the leader's state (``state()``: as it is now), the committer, the keys,
    the world, the configs, a logger, the blobs (a submitted job's code), the storage root,
    the ids of the jobs ever registered, and small ports: the jobs' side (``jobs``), which
    jobs are still being rebuilt (``recovering``), and the handlers of ``DisposeJob`` and
    ``PurgeJob`` (services/jobmanager/kvstate.py, retention.py)."""

    def __init__(
        self,
        *,
        state: CurrentState,
        committer: Committer,
        keys: Keys,
        world: World,
        config: MembershipConfig,
        jobs_config: jobs.JobsConfig,
        logger: Any,
        blobs: Blobs,
        storage_root: str,
        group: str,
        registered: set[str],
        jobs: JobOperations,
        recovering: Callable[[], list[str]],
        dispose: Callable[[Entry, DisposeJob], None],
        purge: Callable[[Entry, PurgeJob], None],
    ) -> None:
        self.state, self.committer, self.keys, self.world = state, committer, keys, world
        self.tag = keys.cluster
        self.config, self.jobs_config, self.logger = config, jobs_config, logger
        self.blobs, self.storage_root, self.group, self.registered = blobs, storage_root, group, registered
        self.jobs, self.recovering, self.dispose, self.purge = jobs, recovering, dispose, purge
        self.root = StorageIdentity(storage_root, config, lambda: state().membership, world, logger)

    def handle(self, entry: Entry) -> None:
        env = entry.envelope
        msg = env.event
        if isinstance(msg, SubmitJob):
            self._submit(entry, msg)
            return
        if isinstance(msg, DisposeJob):  # queryable state (services/jobmanager/kvstate.py)
            self.check_reply_to(msg.reply_to)
            self.dispose(entry, msg)
            return
        if isinstance(msg, PurgeJob):  # bounded storage (services/jobmanager/retention.py)
            self.check_reply_to(msg.reply_to)
            self.purge(entry, msg)
            return
        config = self.root.config() if isinstance(msg, RegisterTaskManager) else self.config  # (the root to check)
        state = self.state()
        decision = decide(state.membership, Inbound(env, config), env.ts)
        if decision.rejected is not None:
            raise decision.rejected  # parked by the caller, as every rejection of this inbox
        sends = [(self.keys.inbox(self.keys.taskmanager(to.name)), reply) for to, reply in decision.sends]
        envs = self.committer.commit(self.tag, decision.facts, sends=sends, consumed=self.consumed(entry), cause=env.id)
        if envs is None:
            return
        self.apply(envs)
        rid = getattr(msg, "resource_id", None)
        if rid is not None and state.membership.is_registered(rid, getattr(msg, "session", "")):
            state.monitor.observe(rid, monotonic_ms(self.world))  # (a timeout: never on the wall clock)
            if isinstance(msg, (RegisterTaskManager, TaskManagerHeartbeat)):
                self.reconcile(msg)

    def reconcile(self, msg: RegisterTaskManager | TaskManagerHeartbeat) -> None:
        """The TaskManager's slot report against the leader's view (services/jobs/reconcile.py):
        what differs for long enough is recorded as facts, cancelled or confirmed. A crash
        half-way is harmless: the next report finds what is left."""
        if msg.attempts is None:
            return  # a TaskManager of an earlier version: it sends no slot report
        now = self.world.now_ms()
        attempts = msg.attempts
        recovering = set(self.recovering())
        if recovering:  # jobs not yet rebuilt: nothing is known of them, so nothing is said of them
            attempts = [a for a in attempts if a.job_id not in recovering]
        state = self.state()
        out = reconciliation.decide(
            state.jobs,
            reconciliation.SlotReport(
                state.reports,
                msg.resource_id,
                msg.session,
                attempts,
                self.config.heartbeat_timeout_ms,
                self.jobs_config,
                clock=monotonic_ms(self.world),
            ),
            now,
        )
        for note in out.notes:
            self.logger.warning("reconciled with a slot report", taskmanager=msg.resource_id, what=note)
        for decision in out.jobs:
            self.jobs.commit(decision)
        inbox = self.keys.inbox(self.keys.taskmanager(msg.resource_id))
        sends: list[tuple[str, Event]] = [(inbox, m) for _, m in out.sends]
        recorded = [task_id for r in out.of(Recorded) for task_id in r.task_ids]
        if recorded:
            sends.append((inbox, TaskStatesRecorded(msg.resource_id, msg.session, self.committer.epoch or 0, recorded)))
        if sends:
            self.committer.commit(self.tag, [], sends=sends)

    def consumed(self, entry: Entry) -> Consumed:
        return Consumed(entry.stream, self.group, entry.id)

    def check_reply_to(self, reply_to: str) -> None:
        problem = self.keys.inbox_problem(reply_to, ("client",))
        if problem is not None:
            raise MessageRejected(problem + "; no reply can be sent, so the request is parked")

    def apply(self, envs: list[Envelope]) -> None:
        """Fold committed cluster facts into the state; a TaskManager that is gone fails its tasks."""
        state = self.state()
        for env in envs:
            evolve(state.membership, env)
            ev = env.event
            if isinstance(ev, (TaskManagerLost, TaskManagerUnregistered)):
                state.monitor.forget(ev.resource_id)
                state.reports.forget(ev.resource_id)
                # (jobs not yet rebuilt learn of it when they join: ``Restorer.orphans``)
                for d in jobs.decide(
                    state.jobs, jobs.TaskManagerGone(ev.resource_id, ev.reason, self.jobs_config, ev.session), env.ts
                ).jobs:
                    self.jobs.commit(d)

    def commit_facts(
        self, facts: list[Event] | tuple[Event, ...], *, consequences: bool = True, now: int | None = None
    ) -> None:
        """Commit cluster facts and fold them; ``consequences=False``: a lost TaskManager's
        tasks are not failed here (a new leader does that once its coordinators run).
        ``now``: when they were decided (their envelopes' time)."""
        envs = self.committer.commit(self.tag, list(facts), now=now)
        if not envs:
            return
        if consequences:
            self.apply(envs)
        else:
            for env in envs:
                evolve(self.state().membership, env)

    # --- jobs ---
    def _submit(self, entry: Entry, msg: SubmitJob) -> None:
        """Validate, then register the job and hand the submission to its own inbox (one
        cluster commit with the outbox), where the job's facts begin."""
        env = entry.envelope
        self.check_reply_to(msg.reply_to)
        problem = id_problem(msg.job_id, "job id")
        found = [problem] if problem else problems(msg.graph)
        if not problem:
            if msg.job_id in self.state().jobs.jobs or self.jobs.following(msg.job_id) or msg.job_id in self.registered:
                found.append(f"job id {msg.job_id} is already taken")
            if not self.blobs.exists(msg.code_blob):
                found.append(f"the job's code (blob {msg.code_blob[:12]}) is not in Redis; submit it again")
        if not found and (blind := self.root.refusal()) is not None:  # a TaskManager said it cannot see the root
            found.append(blind)
        if not found:
            found.extend(
                spark_reach.problems(
                    self.storage_root, [(v.name, v.sink.path) for v in msg.graph.vertices if v.sink is not None]
                )
            )
        if not found:
            try:  # a broadcast input known to be too large already
                found.extend(broadcast_size_problems(msg.graph, broadcast_sizes(msg)))
            except Exception as exc:  # a missing input: plan_splits below names it
                self.logger.debug("broadcast sizes unknown at submission", error=str(exc))
        if not found:
            try:  # the job's marker: how each TaskManager proves it sees the storage and inputs
                job_marker.write(self.storage_root, msg.job_id, job_marker.input_paths(plan_splits(msg)), hostname())
            except Exception as exc:
                found.append(str(exc))
        if found:
            reason = "; ".join(found)
            self.logger.warning("job refused", job=msg.job_id[:40], reason=reason[:300])
            self.committer.commit(
                self.tag,
                [],
                sends=[(msg.reply_to, JobRefused(msg.job_id, reason))],
                consumed=self.consumed(entry),
                cause=env.id,
            )
            return
        job_inbox = self.keys.inbox(self.keys.job(msg.job_id))
        envs = self.committer.commit(
            self.tag,
            [JobRegistered(msg.job_id, msg.graph.name)],
            sends=[(job_inbox, msg)],
            consumed=self.consumed(entry),
            cause=env.id,
        )
        if envs is not None:
            self.registered.add(msg.job_id)
            self.jobs.follow(msg.job_id)

    # --- time ---
    def timeouts(self, now: int) -> None:
        """TaskManagers not heard from within the heartbeat timeout are lost."""
        state = self.state()
        decision = decide(state.membership, Timeouts(state.monitor, self.config), monotonic_ms(self.world))
        for fact in decision.facts:
            lost = cast(TaskManagerLost, fact)  # the only fact a Timeouts decides
            self.logger.warning("taskmanager lost", resource_id=lost.resource_id, reason=lost.reason)
        if decision.facts:
            self.commit_facts(decision.facts, now=now)


class TimeoutGate:
    """Whether heartbeat timeouts may be decided now: only on a fresh view of the cluster
    inbox, read to its end (heartbeats still waiting in a backlog, or sent while a step
    stalled after its read, would make live TaskManagers look lost). Never put off for
    longer than the timeout itself: a busy inbox or slow steps must not keep dead
    TaskManagers counted for ever. Built from the heartbeat timeout, the read's batch (to
    say so) and a logger."""

    def __init__(self, timeout_ms: int, batch: int, logger: Any) -> None:
        self.timeout_ms, self.batch, self.logger = timeout_ms, batch, logger
        self._behind_since: int | None = None
        self.while_behind = False
        """Timeouts are decided though the cluster inbox has not been read to its end (it has
        stayed behind for longer than the timeout): a live TaskManager may be lost."""

    def ready(self, now: int, caught_up: bool, read_at: int) -> bool:
        """``now`` and ``read_at``: the monotonic clock, in ms."""
        timeout = self.timeout_ms
        ready = caught_up and now - read_at <= timeout // 2
        if ready:
            self._behind_since = None
        elif self._behind_since is None:
            self._behind_since = now
        elif now - self._behind_since > timeout:
            if not self.while_behind:
                self.logger.warning(
                    "the cluster inbox stays behind; deciding heartbeat timeouts anyway",
                    behind_ms=now - self._behind_since,
                    batch=self.batch,
                )
            ready = True
        self.while_behind = ready and self._behind_since is not None
        return ready
