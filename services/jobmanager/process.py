"""The JobManager shell: win the lease, rebuild state from the log, then serve the inboxes.

One main loop does everything that changes state: it reads the cluster inbox and every
running job's inbox, asks the pure cores what each message causes, and commits the facts,
the outgoing messages (into the committing tag's outbox) and the inbox acknowledgement in
one fenced script per tag. Timers (heartbeats, lease renewal, restarts, slot timeouts)
run in the same loop between reads.
"""

from __future__ import annotations

import threading
import time

from sluice.errors import DecodeError, RedisUnavailable, StaleEpoch
from sluice.events import (
    FIELD,
    CoordinatorCheckpointed,
    DisposeJob,
    Envelope,
    ExecutionGraphBuilt,
    Event,
    JobManagerHeartbeat,
    JobRefused,
    JobRegistered,
    JobStatus,
    LeadershipGranted,
    SubmitJob,
    TaskManagerLost,
    encode,
)
from sluice.services.common.shell import get_logger, hostname, new_id, now_ms
from sluice.services.coordination.runtime import DEFAULT_CHECKPOINT_INTERVAL_MS, JobCoordinators, operator_of
from sluice.services.jobs import core as jobs
from sluice.services.jobs.state import TERMINAL_JOB, JobsState
from sluice.services.jobs.state import evolve as jobs_evolve
from sluice.services.jobs.validate import problems
from sluice.services.membership.core import (
    HeartbeatMonitor,
    Membership,
    MembershipConfig,
    UnexpectedMessage,
    decide,
    decide_timeouts,
    evolve,
)
from sluice.store import Blobs, Consumed, Deliverer, EventLog, GroupConsumer, KvStates, LeaderLease, Out, tag_of

from .kvstate import dispose_job, retired_state
from sluice.store.consumer import Entry

__all__ = ["JobManager", "GROUP"]

GROUP = "jobmanager"


class _Rejected(DecodeError):
    kind = "rejected"


class _Rebuild(Exception):
    """The in-memory state may be ahead of the log (a commit did not happen): rebuild it."""


class JobManager:
    def __init__(
        self,
        log: EventLog,
        *,
        config: MembershipConfig = MembershipConfig(),
        jobs_config: jobs.JobsConfig = jobs.JobsConfig(),
        lease_ttl_ms: int = 3000,
        jm_id: str | None = None,
        inbox_retention_ms: int = 600_000,
        storage_root: str = "file:///tmp/sluice-storage",
        max_stall_s: float = 60.0,
        checkpoint_interval_ms: int = DEFAULT_CHECKPOINT_INTERVAL_MS,
    ) -> None:
        self.checkpoint_interval_ms = checkpoint_interval_ms
        self.coords: dict[str, JobCoordinators] = {}
        self.max_stall_s = max_stall_s
        self._progress = 0.0
        self.log = log
        self.keys = log.keys
        self.config = config
        self.jobs_config = jobs_config
        self.storage_root = storage_root
        self.inbox_retention_ms = inbox_retention_ms
        self.id = jm_id or f"jm-{hostname()}-{new_id()[:8]}"
        self.lease = LeaderLease(log, self.id, lease_ttl_ms)
        self.tag = self.keys.cluster
        self.inbox = self.keys.inbox(self.tag)
        self.facts = self.keys.facts(self.tag)
        self.outbox = self.keys.outbox(self.tag)
        self.blobs = Blobs(log)
        self.state = Membership()
        self.jobs = JobsState()
        self.monitor = HeartbeatMonitor()
        self.epoch: int | None = None
        self.logger = get_logger("jobmanager", jm=self.id)
        self.deliverers: dict[str, Deliverer] = {}
        self.consumer = GroupConsumer(log, self.inbox, GROUP, self.id, on_dead_letter=self._dead_lettered)
        self._next_trim = 0

    # --- lifecycle -----------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Stand by until leading, lead until deposed or stopped; survive Redis outages."""
        backoff = 0.1
        announced = False
        while not stop.is_set():
            try:
                epoch = self.lease.try_acquire()
                if epoch is None:
                    if not announced:
                        holder = self.lease.current()
                        self.logger.info("standby", leader=holder.holder if holder else None,
                                         epoch=holder.epoch if holder else None)
                        announced = True
                    stop.wait(self.lease.ttl_ms / 4000)
                    continue
                announced = False
                backoff = 0.1
                self.lead(epoch, stop)
            except StaleEpoch as exc:
                self.logger.warning("deposed", error=str(exc))
                self.epoch = None
            except _Rebuild as exc:
                self.logger.warning("state may be ahead of the log; rebuilding from the log", why=str(exc))
            except RedisUnavailable as exc:
                self.logger.error("redis unavailable, retrying", error=str(exc), retry_in_s=backoff)
                self.epoch = None
                stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            except Exception as exc:  # anything else: never die; rebuild from the log and go on
                self.logger.exception("unexpected error; rebuilding from the log", error=str(exc),
                                      retry_in_s=backoff)
                stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
        if self.epoch is not None:
            try:
                self.lease.release()
                self.logger.info("released leadership", epoch=self.epoch)
            except RedisUnavailable:
                pass

    def become_leader(self, epoch: int) -> None:
        """Rebuild state from the log and announce the new epoch (no message is served before)."""
        self.epoch = epoch
        state = Membership()
        registered: list[str] = []
        n = 0
        for _, env in self.log.replay(self.facts):
            evolve(state, env)
            if isinstance(env.event, JobRegistered):
                registered.append(env.event.job_id)
            n += 1
        self.state = state
        self.jobs = JobsState()
        self._close_coordinators()
        self.consumer = GroupConsumer(self.log, self.inbox, GROUP, self.id, on_dead_letter=self._dead_lettered)
        restoring = []
        for job_id in registered:
            tag = self.keys.job(job_id)
            self.log.fence(tag, epoch)  # from now on a deposed leader cannot write to this job
            checkpoints: dict[str, tuple[int, object, list[int] | None]] = {}
            tails: dict[str, list[Event]] = {}
            for _, env in self.log.replay(self.keys.facts(tag)):
                jobs_evolve(self.jobs, env)
                n += 1
                op = operator_of(env.event)
                if op is None:
                    continue
                if isinstance(env.event, CoordinatorCheckpointed):
                    run = self.jobs.jobs[job_id].vertices.get(op)
                    attempts = [ex.attempt for ex in run.subtasks] if run else None
                    checkpoints[op] = (env.event.checkpoint_id, env.event.state, attempts)
                    tails[op] = []
                else:
                    tails.setdefault(op, []).append(env.event)
            job = self.jobs.jobs.get(job_id)
            if job is None or job.status not in TERMINAL_JOB:
                self.consumer.add_stream(self.keys.inbox(tag))
            if job is not None and job.built and job.status not in TERMINAL_JOB:
                # Coordinators exist before leadership is used: restored first, bound and started
                # below, then fed what happened after their checkpoints.
                coords = self._create_coordinators(job_id)
                for op, (cid, cstate, attempts) in checkpoints.items():
                    coords.restore(op, cid, cstate, attempts)
                restoring.append((job_id, coords, tails))
        self._commit(self.tag, (LeadershipGranted(epoch, self.id, hostname()),), (), None)
        for job_id, coords, tails in restoring:
            coords.start(now_ms())
            coords.replay(tails)
            self._commit_job(jobs.Decision(job_id, now_ms()))
        self.monitor.restart(self.state, now_ms())
        for tag in [self.tag] + [self.keys.job(j) for j in registered]:
            self._deliverer(tag).deliver()
        self.consumer.ensure_group()
        self.logger.info("leading", epoch=epoch, replayed=n, taskmanagers=len(self.state.active()),
                         jobs=len(self.jobs.jobs))
        # Messages a previous leader read but never committed: ours now.
        self.handle_batch(self.consumer.reclaim(min_idle_ms=0) + self.consumer.pending())
        # A TaskManager lost (or gone) in the cluster's facts whose tasks were not failed yet
        # (the leader died between the two commits): fail them now.
        active = {r.resource_id for r in self.state.active()}
        for rid in sorted(set(self.jobs.pool.by_tm) - active):
            if self.jobs.pool.by_tm[rid]:
                row = self.state.taskmanagers.get(rid)
                for d in jobs.taskmanager_lost(self.jobs, rid, row.reason if row and row.reason else "not registered",
                                               self.jobs_config, now_ms()):
                    self._commit_job(d)
        self.schedule_all()

    def lead(self, epoch: int, stop: threading.Event) -> None:
        lost = threading.Event()
        done = threading.Event()
        self._progress = time.monotonic()
        renewer = threading.Thread(target=self._renew, args=(epoch, lost, done), name="lease-renewal", daemon=True)
        renewer.start()
        try:
            self.become_leader(epoch)
            interval = self.config.heartbeat_interval_ms
            next_tick = 0.0
            while not stop.is_set():
                if lost.is_set():
                    self.logger.warning("lost the lease, stepping down", epoch=epoch)
                    self.epoch = None
                    return
                self._progress = time.monotonic()
                entries = self.consumer.read(count=500, block_ms=min(50, interval))
                if entries:
                    self.handle_batch(entries)
                    self.schedule_all()
                now = now_ms()
                if now >= next_tick:
                    self.tick(now)
                    next_tick = now + min(interval, 200)
        finally:
            done.set()
            renewer.join()
            self._close_coordinators()

    def _renew(self, epoch: int, lost: threading.Event, done: threading.Event) -> None:
        """Keep the lease while the main loop makes progress. A loop stalled for longer than
        ``max_stall_s`` lets the lease lapse so a standby can take over; the fence then
        refuses whatever the stalled loop tries to commit afterwards."""
        every = self.lease.ttl_ms / 3000
        while not done.wait(every):
            if time.monotonic() - self._progress > self.max_stall_s:
                self.logger.error("main loop stalled; letting the lease lapse", stalled_s=self.max_stall_s)
                lost.set()
                return
            try:
                if not self.lease.renew():
                    lost.set()
                    return
            except RedisUnavailable:
                continue  # the main loop sees it too; the lease may still be ours

    # --- handling ------------------------------------------------------------------------

    def handle_batch(self, entries: list[Entry]) -> None:
        """Cluster messages one by one; each job's messages decided in order and committed
        together (one group commit per job and batch: a busy job costs one round trip per
        batch, not per message)."""
        by_job: dict[str, list[Entry]] = {}
        for entry in entries:
            if entry.stream == self.inbox:
                self._guarded(entry, self._handle_cluster)
            else:
                by_job.setdefault(entry.stream, []).append(entry)
        for stream, group in by_job.items():
            self._handle_job_batch(stream, group)

    def handle(self, entry: Entry) -> None:
        self.handle_batch([entry])

    def _guarded(self, entry: Entry, fn) -> object:
        env = entry.envelope
        try:
            return fn(entry)
        except (StaleEpoch, RedisUnavailable, _Rebuild):
            raise
        except (UnexpectedMessage, jobs.UnexpectedJobMessage) as exc:
            self._park(entry, str(exc))
        except Exception as exc:  # a bug in a core must not kill the JobManager
            self.logger.exception("handler failed; entry parked", entry=entry.id, type=env.type)
            self._park(entry, f"handler failed: {exc!r}")
            raise _Rebuild(f"handler for {env.type} raised") from exc
        return None

    def _handle_cluster(self, entry: Entry) -> None:
        env = entry.envelope
        if isinstance(env.event, SubmitJob):
            self._submit(entry, env.event)
            return
        if isinstance(env.event, DisposeJob):  # queryable state (services/jobmanager/kvstate.py)
            dispose_job(self, entry, env.event)
            return
        decision = decide(self.state, env, self.config)
        if self._commit(self.tag, decision.facts, decision.replies, entry, cause=env.id):
            msg = env.event
            rid = getattr(msg, "resource_id", None)
            if rid is not None and self.state.is_registered(rid, getattr(msg, "session", "")):
                self.monitor.observe(rid, now_ms())

    def _submit(self, entry: Entry, msg: SubmitJob) -> None:
        """Validate, then register the job and hand the submission to its own inbox (one
        cluster commit with the outbox), where the job's facts begin."""
        env = entry.envelope
        found = problems(msg.graph)
        if msg.job_id in self.jobs.jobs or self.keys.inbox(self.keys.job(msg.job_id)) in self.consumer.streams:
            found.append(f"job id {msg.job_id} is already taken")
        if not self.blobs.exists(msg.code_blob):
            found.append(f"the job's code (blob {msg.code_blob[:12]}) is not in Redis; submit it again")
        if not found:
            try:
                self._plan_splits(msg)
            except Exception as exc:
                found.append(str(exc))
        if found:
            reason = "; ".join(found)
            self.logger.warning("job refused", job=msg.job_id, reason=reason)
            self._commit(self.tag, (), (), entry, cause=env.id,
                         sends=[(msg.reply_to, JobRefused(msg.job_id, reason))])
            return
        job_inbox = self.keys.inbox(self.keys.job(msg.job_id))
        self._commit(self.tag, (JobRegistered(msg.job_id, msg.graph.name),), (), entry, cause=env.id,
                     sends=[(job_inbox, msg)])
        self.consumer.add_stream(job_inbox)

    def _plan_splits(self, msg: SubmitJob) -> dict[str, list]:
        """Each source's split enumerator discovers its splits (a missing input refuses the job)."""
        from sluice.services.coordination.source import discover

        return {v.name: discover(v.source.format, v.source.paths, v.source.split_bytes, v.source.options)
                for v in msg.graph.vertices if v.source is not None}

    def _handle_job_batch(self, stream: str, entries: list[Entry]) -> None:
        tag = tag_of(stream)
        job_id = self.keys.job_id_of(tag)
        merged = jobs.Decision(job_id, now_ms())
        done: list[str] = []
        for entry in entries:
            decision = self._guarded(entry, lambda e: self._decide_job(job_id, e))
            if decision is None:
                continue  # parked
            merged.facts += decision.facts
            merged.sends += decision.sends
            merged.checkpoint |= decision.checkpoint
            done.append(entry.id)
        if done:
            self._commit_job(merged, stream, tuple(done))

    def _decide_job(self, job_id: str, entry: Entry) -> jobs.Decision:
        env = entry.envelope
        now = now_ms()
        if isinstance(env.event, SubmitJob):
            if job_id in self.jobs.jobs:
                return jobs.Decision(job_id, now)  # already accepted: a redelivery
            try:
                splits = self._plan_splits(env.event)
            except Exception as exc:
                return jobs.Decision(job_id, now, sends=[(("inbox", env.event.reply_to), JobRefused(job_id, str(exc)))])
            self.logger.info("job submitted", job=job_id, name=env.event.graph.name,
                             subtasks=sum(v.parallelism for v in env.event.graph.vertices))
            return jobs.submit(self.jobs, env.event, splits, self.storage_root, now)
        decision = jobs.on_message(self.jobs, job_id, env, self.jobs_config, now)
        if decision.note:
            self.logger.debug("job message", job=job_id, note=decision.note)
        return decision

    def schedule_all(self) -> None:
        free = None
        for job_id, job in list(self.jobs.jobs.items()):
            if job.ready and job.status in (JobStatus.CREATED, JobStatus.RUNNING):
                free = free if free is not None else self._free_slots()
                if job.waiting_since is not None and not any(free.values()):
                    continue  # already waiting for slots and none is free: nothing to try
                decision = jobs.schedule(self.jobs, job_id, free, now_ms())
                if decision:
                    self._commit_job(decision)

    def _free_slots(self) -> jobs.FreeSlots:
        used = self.jobs.pool.by_tm
        return {r.resource_id: [s for s in range(r.slots) if s not in used.get(r.resource_id, ())]
                for r in sorted(self.state.active(), key=lambda r: r.resource_id)}

    def tick(self, now: int) -> None:
        # Entries another consumer read and never committed (it crashed, or it was a
        # deposed leader that read one more message before learning so): ours now.
        self.handle_batch(self.consumer.reclaim(min_idle_ms=self.lease.ttl_ms))
        decision = decide_timeouts(self.state, self.monitor, now, self.config)
        if decision.facts:
            for fact in decision.facts:
                self.logger.warning("taskmanager lost", resource_id=fact.resource_id, reason=fact.reason)
            self._commit(self.tag, decision.facts, (), None)
        total = sum(r.slots for r in self.state.active())
        for d in jobs.tick(self.jobs, self.jobs_config, now, total):
            self._commit_job(d)
        self.flush_coordinators(now)
        self.schedule_all()
        self._send_heartbeats()
        if now >= self._next_trim:
            self.log.trim_consumed(self.inbox, GROUP, keep_ms=self.inbox_retention_ms, now_ms=now)
            self._next_trim = now + min(self.inbox_retention_ms, 10_000)

    def _send_heartbeats(self) -> None:
        active = self.state.active()
        if not active:
            return
        hb = Envelope(JobManagerHeartbeat(self.epoch or 0, self.id), new_id(), self.epoch or 0, now_ms())
        self.log.append_each([(self.keys.inbox(self.keys.taskmanager(row.resource_id)), hb) for row in active])

    # --- committing ----------------------------------------------------------------------

    def _commit_job(self, decision: jobs.Decision, stream: str | None = None, entry_ids: tuple[str, ...] = ()) -> None:
        """Commit a job decision, acknowledging ``entry_ids`` of the job's inbox, with what the
        job's coordinators did in answer to its facts (in the same script)."""
        tag = self.keys.job(decision.job_id)
        deliver = self._coordinate(decision)
        if not decision.facts and not decision.sends and not entry_ids:
            return
        sends = []
        for (kind, where), ev in decision.sends:
            target = self.keys.inbox(self.keys.taskmanager(where)) if kind == "tm" else where
            sends.append((target, ev))
        consumed = Consumed(stream, GROUP, entry_ids) if stream and entry_ids else None
        # One decision, one script: its facts and its messages land together or not at all
        # (deployments are capped per pass, so a script stays short).
        ok = self._commit(tag, tuple(decision.facts), (), None, sends=sends, apply=False, consumed=consumed,
                          deliver=deliver)
        if not ok:
            raise _Rebuild(f"a job commit for {decision.job_id} was a duplicate")
        coords = self.coords.get(decision.job_id)
        if coords is not None:
            coords.committed()
        retired = retired_state(decision.facts)
        if retired:  # queryable state of attempts that ended: no longer served
            KvStates(self.log.backend, self.keys).delete(decision.job_id, retired)
        job = self.jobs.jobs.get(decision.job_id)
        if job is not None and job.status in TERMINAL_JOB:
            if coords is not None:
                coords.close()
                del self.coords[decision.job_id]
            if self.keys.inbox(tag) in self.consumer.streams:
                self.consumer.remove_stream(self.keys.inbox(tag))
                self.logger.info("job ended", job=decision.job_id, status=job.status.value, reason=job.reason)

    # --- coordinators --------------------------------------------------------------------

    def _create_coordinators(self, job_id: str) -> JobCoordinators:
        job = self.jobs.jobs[job_id]
        coords = JobCoordinators(job_id, job.graph.vertices, job.splits, self._loader(job_id),
                                 interval_ms=self.checkpoint_interval_ms)
        self.coords[job_id] = coords
        return coords

    def _loader(self, job_id: str):
        """Imports a user coordinator class (``module:qualname``) from the job's code."""
        def load(ref: str) -> type:
            import importlib
            import tempfile
            from pathlib import Path

            from sluice.services.taskmanager.library import LibraryCache, load_module

            job = self.jobs.jobs[job_id]
            module_name, _, qualname = ref.partition(":")
            if module_name == job.module:
                cache = LibraryCache(self.blobs, Path(tempfile.gettempdir()) / "sluice-jobmanager-code")
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
        job_id, now = decision.job_id, decision.now
        coords = self.coords.get(job_id)
        for ev in list(decision.facts):
            if isinstance(ev, ExecutionGraphBuilt) and coords is None:
                coords = self._create_coordinators(job_id)
                coords.start(now)
            elif coords is not None:
                coords.feed(ev)
        if coords is None:
            return {}
        job = self.jobs.jobs.get(job_id)
        ending = job is not None and job.status in TERMINAL_JOB  # a last checkpoint keeps the final state
        flush = coords.flush(now, force=decision.checkpoint or ending)
        if flush.failures:
            reason = "\n".join(flush.failures)
            self.logger.error("coordinator failed; failing the job", job=job_id, reason=reason.splitlines()[0])
            failed = jobs.fail_job(self.jobs, job_id, reason, now)
            for ev in failed.facts:
                coords.feed(ev)
            decision.facts += failed.facts
            decision.sends += failed.sends
        tag = self.keys.job(job_id)
        deliver: dict[int, str] = {}
        for ev, to in flush.facts:
            if to is not None:
                deliver[len(decision.facts)] = self.keys.task_inbox(tag, to[0], to[1])
            decision.facts.append(ev)
        return deliver

    def _close_coordinators(self) -> None:
        for coords in self.coords.values():
            coords.close()
        self.coords = {}

    def flush_coordinators(self, now: int) -> None:
        """Periodic checkpoints, and what coordinator threads did since the last pass."""
        for job_id in list(self.coords):
            self._commit_job(jobs.Decision(job_id, now))

    def _commit(self, tag: str, facts: tuple[Event, ...], replies: tuple[tuple[str, Event], ...],
                entry: Entry | None, cause: str | None = None, sends: list[tuple[str, Event]] | None = None,
                apply: bool = True, consumed: Consumed | None = None, deliver: dict[int, str] | None = None) -> bool:
        """Commit facts (to ``tag``'s fact stream) and messages (to its outbox), acknowledging
        ``entry``. ``replies`` go to TaskManagers by resource id, ``sends`` to inbox keys.
        With ``apply`` the membership facts are folded into the state after the commit."""
        assert self.epoch is not None
        ts = now_ms()
        job = self.keys.job_id_of(tag)
        fact_envs = [Envelope(f, new_id(), self.epoch, ts, job, cause) for f in facts]
        outs = [Out(self.keys.facts(tag), e) for e in fact_envs]
        for i, inbox in (deliver or {}).items():  # same tag: written in this very commit
            outs.append(Out(inbox, fact_envs[i]))
        outbox = self.keys.outbox(tag)
        targets = [(self.keys.inbox(self.keys.taskmanager(rid)), r) for rid, r in replies] + list(sends or [])
        outs += [Out(outbox, Envelope(r, new_id(), self.epoch, ts, job, cause), to=target) for target, r in targets]
        if entry is not None:
            consumed = Consumed(entry.stream, GROUP, entry.id)
        result = self.log.commit(tag, self.epoch, outs, consumed)
        if result.duplicate:
            self.logger.info("redelivered entry ignored", entries=consumed.ids if consumed else None)
            return False
        if apply:
            for env in fact_envs:
                evolve(self.state, env)
                if isinstance(env.event, TaskManagerLost) or env.type == "TaskManagerUnregistered":
                    self.monitor.forget(env.event.resource_id)
                    for d in jobs.taskmanager_lost(self.jobs, env.event.resource_id, env.event.reason,
                                                   self.jobs_config, ts):
                        self._commit_job(d)
        if targets:
            self._deliverer(tag).deliver()
        return True

    def _deliverer(self, tag: str) -> Deliverer:
        d = self.deliverers.get(tag)
        if d is None:
            d = self.deliverers[tag] = Deliverer(self.log, tag)
        return d

    def _park(self, entry: Entry, reason: str) -> None:
        self.consumer.dead_letter(entry.id, {FIELD: encode(entry.envelope)}, _Rejected(reason), stream=entry.stream)

    def _dead_lettered(self, stream: str, entry_id: str, error: DecodeError) -> None:
        self.logger.warning("entry parked in dead letters", stream=stream, entry=entry_id, error=str(error))
