"""The cluster inbox: TaskManagers joining, beating and leaving; jobs submitted, disposed and purged.

Membership is decided by its pure core (services/membership/core.py); this part turns a
message into a commit on the cluster's tag, keeps the heartbeat monitor, and decides
timeouts only once the inbox has been read to its end (heartbeats waiting in a backlog
after a stall are heard before anyone is declared lost).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

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
from sluice.services.common.world import monotonic_ms
from sluice.services.dataplane import spark_reach
from sluice.services.jobs import core as jobs
from sluice.services.jobs import reconcile as reconciliation
from sluice.services.jobs.validate import problems
from sluice.services.membership.core import Inbound, Timeouts, decide, evolve
from sluice.store import Consumed
from sluice.store.consumer import Entry

from .kvstate import dispose_job
from .storage_identity import StorageIdentity

if TYPE_CHECKING:
    from .process import JobManager

__all__ = ["ClusterInbox", "plan_splits"]


def plan_splits(msg: SubmitJob) -> dict[str, list]:
    """Each source's split enumerator discovers its splits (a missing input refuses the job)."""
    from sluice.services.coordination.source import discover

    return {v.name: discover(v.source.format, v.source.paths, v.source.split_bytes, v.source.options)
            for v in msg.graph.vertices if v.source is not None}


class ClusterInbox:
    def __init__(self, jm: JobManager) -> None:
        self.jm = jm
        self.root = StorageIdentity(jm)

    def handle(self, entry: Entry) -> None:
        jm = self.jm
        env = entry.envelope
        msg = env.event
        if isinstance(msg, SubmitJob):
            self._submit(entry, msg)
            return
        if isinstance(msg, DisposeJob):  # queryable state (services/jobmanager/kvstate.py)
            self.check_reply_to(msg.reply_to)
            dispose_job(jm, entry, msg)
            return
        if isinstance(msg, PurgeJob):  # bounded storage (services/jobmanager/retention.py)
            self.check_reply_to(msg.reply_to)
            jm.retention.on_request(entry, msg)
            return
        config = self.root.config() if isinstance(msg, RegisterTaskManager) else jm.config  # (the root to check)
        decision = decide(jm.state.membership, Inbound(env, config), env.ts)
        if decision.rejected is not None:
            raise decision.rejected  # parked by the caller, as every rejection of this inbox
        sends = [(jm.keys.inbox(jm.keys.taskmanager(to.name)), reply) for to, reply in decision.sends]
        envs = jm.committer.commit(jm.tag, decision.facts, sends=sends, consumed=self.consumed(entry), cause=env.id)
        if envs is None:
            return
        self.apply(envs)
        rid = getattr(msg, "resource_id", None)
        if rid is not None and jm.state.membership.is_registered(rid, getattr(msg, "session", "")):
            jm.state.monitor.observe(rid, monotonic_ms(jm.world))  # (a timeout: never on the wall clock)
            if isinstance(msg, (RegisterTaskManager, TaskManagerHeartbeat)):
                self.reconcile(msg)

    def reconcile(self, msg: RegisterTaskManager | TaskManagerHeartbeat) -> None:
        """The TaskManager's slot report against the leader's view (services/jobs/reconcile.py):
        what differs for long enough is recorded as facts, cancelled or confirmed. A crash
        half-way is harmless: the next report finds what is left."""
        jm = self.jm
        if msg.attempts is None:
            return  # a TaskManager of an earlier version: it sends no slot report
        now = jm.world.now_ms()
        attempts = msg.attempts
        recovering = set(jm.recovering)
        if recovering:  # jobs not yet rebuilt: nothing is known of them, so nothing is said of them
            attempts = [a for a in attempts if a.job_id not in recovering]
        out = reconciliation.decide(jm.state.jobs, reconciliation.SlotReport(
            jm.state.reports, msg.resource_id, msg.session, attempts, jm.config.heartbeat_timeout_ms, jm.jobs_config,
            clock=monotonic_ms(jm.world)), now)
        for note in out.notes:
            jm.logger.warning("reconciled with a slot report", taskmanager=msg.resource_id, what=note)
        for decision in out.jobs:
            jm.job_inboxes.commit(decision)
        inbox = jm.keys.inbox(jm.keys.taskmanager(msg.resource_id))
        sends: list[tuple[str, Event]] = [(inbox, m) for _, m in out.sends]
        recorded = [task_id for r in out.of(Recorded) for task_id in r.task_ids]
        if recorded:
            sends.append((inbox, TaskStatesRecorded(msg.resource_id, msg.session, jm.committer.epoch or 0,
                                                    recorded)))
        if sends:
            jm.committer.commit(jm.tag, [], sends=sends)

    def consumed(self, entry: Entry) -> Consumed:
        return Consumed(entry.stream, self.jm.group, entry.id)

    def check_reply_to(self, reply_to: str) -> None:
        problem = self.jm.keys.inbox_problem(reply_to, ("client",))
        if problem is not None:
            raise MessageRejected(problem + "; no reply can be sent, so the request is parked")

    def apply(self, envs: list[Envelope]) -> None:
        """Fold committed cluster facts into the state; a TaskManager that is gone fails its tasks."""
        jm = self.jm
        for env in envs:
            evolve(jm.state.membership, env)
            ev = env.event
            if isinstance(ev, (TaskManagerLost, TaskManagerUnregistered)):
                jm.state.monitor.forget(ev.resource_id)
                jm.state.reports.forget(ev.resource_id)
                # (jobs not yet rebuilt learn of it when they join: ``JobManager._orphans``)
                for d in jobs.decide(jm.state.jobs, jobs.TaskManagerGone(ev.resource_id, ev.reason, jm.jobs_config,
                                                                         ev.session), env.ts).jobs:
                    jm.job_inboxes.commit(d)

    def commit_facts(self, facts: list[Event] | tuple[Event, ...], *, consequences: bool = True,
                     now: int | None = None) -> None:
        """Commit cluster facts and fold them; ``consequences=False``: a lost TaskManager's
        tasks are not failed here (a new leader does that once its coordinators run).
        ``now``: when they were decided (their envelopes' time)."""
        envs = self.jm.committer.commit(self.jm.tag, list(facts), now=now)
        if not envs:
            return
        if consequences:
            self.apply(envs)
        else:
            for env in envs:
                evolve(self.jm.state.membership, env)

    # --- jobs ---
    def _submit(self, entry: Entry, msg: SubmitJob) -> None:
        """Validate, then register the job and hand the submission to its own inbox (one
        cluster commit with the outbox), where the job's facts begin."""
        jm = self.jm
        env = entry.envelope
        self.check_reply_to(msg.reply_to)
        problem = id_problem(msg.job_id, "job id")
        found = [problem] if problem else problems(msg.graph)
        if not problem:
            if msg.job_id in jm.state.jobs.jobs or jm.job_inboxes.following(msg.job_id) or msg.job_id in jm.registered:
                found.append(f"job id {msg.job_id} is already taken")
            if not jm.blobs.exists(msg.code_blob):
                found.append(f"the job's code (blob {msg.code_blob[:12]}) is not in Redis; submit it again")
        if not found and (blind := self.root.refusal()) is not None:  # a TaskManager said it cannot see the root
            found.append(blind)
        if not found:
            found.extend(spark_reach.problems(jm.storage_root, [(v.name, v.sink.path) for v in msg.graph.vertices
                                                                 if v.sink is not None]))
        if not found:
            try:  # the job's marker: how each TaskManager proves it sees the storage and inputs
                job_marker.write(jm.storage_root, msg.job_id, job_marker.input_paths(plan_splits(msg)), hostname())
            except Exception as exc:
                found.append(str(exc))
        if found:
            reason = "; ".join(found)
            jm.logger.warning("job refused", job=msg.job_id[:40], reason=reason[:300])
            jm.committer.commit(jm.tag, [], sends=[(msg.reply_to, JobRefused(msg.job_id, reason))],
                                consumed=self.consumed(entry), cause=env.id)
            return
        job_inbox = jm.keys.inbox(jm.keys.job(msg.job_id))
        envs = jm.committer.commit(jm.tag, [JobRegistered(msg.job_id, msg.graph.name)], sends=[(job_inbox, msg)],
                                   consumed=self.consumed(entry), cause=env.id)
        if envs is not None:
            jm.registered.add(msg.job_id)
            jm.job_inboxes.follow(msg.job_id)

    # --- time ---
    def timeouts(self, now: int) -> None:
        """TaskManagers not heard from within the heartbeat timeout are lost."""
        decision = decide(self.jm.state.membership, Timeouts(self.jm.state.monitor, self.jm.config),
                          monotonic_ms(self.jm.world))
        for fact in decision.facts:
            lost = cast(TaskManagerLost, fact)  # the only fact a Timeouts decides
            self.jm.logger.warning("taskmanager lost", resource_id=lost.resource_id, reason=lost.reason)
        if decision.facts:
            self.commit_facts(decision.facts, now=now)
