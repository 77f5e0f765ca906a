"""Restarts of the Redis server, and failovers of its shards: noticed, and announced with a new
leader's epoch.

A restart is noticed even while nothing is written (redis-py reconnects without a word):
the leader asks the server's run id at every tick (``ServerWatch.check``: the state in
memory may be ahead of what the server kept, so it is rebuilt from the log), and a
standby remembers the run id it last saw (``ServerWatch.seen``: a leader may lose even the
last grant with the restart). A server that does not keep every acknowledged write is
announced with the next epoch (``announce``), and nothing that ran across it is trusted
(``log_restarted``).

On a Redis Cluster, the server is the masters of its shards, named by their slot ranges and
identities (store/shards.py: run id and replication id each). A failover of one shard
promotes a replica that may miss the last writes the master acknowledged (replication is
asynchronous): it is a restart of that shard's log, seen as one (another identity), and
recovered per shard: the two server ids tell which slots failed over (``failed_slots``), and
only what lives there pays. The cluster's tag there: the cluster-level state restarts (every
TaskManager registers again); a job's tag there: that job's unfinished attempts run again,
renumbered; a TaskManager's tag there: that TaskManager registers again. One more step than
on one Redis: outboxes on the shards that kept their writes may have delivered entries the
failed shard lost, so the new leader delivers them again (``rewinds``).
"""

from __future__ import annotations

from typing import Any

from sluice.errors import StoreRestarted
from sluice.events import Event, JobSubmitted, LeadershipGranted, LogRestarted, TaskManagerLost
from sluice.services.membership.core import Membership
from sluice.store.keys import Keys, tag_of
from sluice.store.shards import Slots, failed_slots, in_slots, keeps_every_write, keyslot, sharded

__all__ = ["ServerWatch", "announce", "log_restarted", "reconcile", "rewinds"]


class ServerWatch:
    """The Redis run ids this JobManager saw. Built from the cluster's tag (to say where a
    restart was met)."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.seen_server: str | None = None
        """The Redis run id this JobManager last saw; a different one later means a restart."""
        self.saw_restart: tuple[str, str] | None = None
        """(run id before, run id now) of the last restart seen and not yet announced."""

    def seen(self, server: str) -> None:
        """The server's run id, asked before taking the lease."""
        if self.seen_server is not None and self.seen_server != server:
            self.saw_restart = (self.seen_server, server)  # even if the log kept no trace of it
        self.seen_server = server

    def check(self, server: str, leading_on: str) -> None:
        """The leader's state was rebuilt from the server ``leading_on``; ``server`` answers
        now: a different one restarted (StoreRestarted)."""
        if leading_on and server != leading_on:
            self.saw_restart = (leading_on, server)
            raise StoreRestarted(tag=self.tag, run_id=server)

    def announced(self) -> None:
        self.saw_restart = None


def announce(
    granted: LeadershipGranted,
    last: LeadershipGranted | None,
    saw_restart: tuple[str, str] | None,
    backend: Any,
    membership: Membership,
    logger: Any,
    keys: Keys,
) -> tuple[LeadershipGranted, list[Event], bool]:
    """What a new leader commits with its epoch (``granted``), after the log's ``last`` grant:
    (the grant it leads under, the cluster facts to commit, whether their consequences are
    carried out at once). When the Redis server restarted since the last grant (or since
    this JobManager saw it: ``saw_restart``, (before, now)) and does not keep every write,
    the restart is announced in the same commit as the new epoch, so a leader that dies
    right after still leaves it on record; the lost TaskManagers' tasks are failed later,
    once the coordinators run (they must see the facts in order)."""
    server = granted.server
    before = last.server if last is not None and last.server and last.server != server else None
    if before is None and saw_restart is not None and saw_restart[1] == server:
        before = saw_restart[0]  # the log lost even the last leader's grant: we remember
    if before is not None and not keeps_every_write(backend.durable(), server):
        restart = log_restarted(before, server, backend.time_ms(), membership, logger, keys)
        return granted, [*restart, granted], False
    if last is None or (last.epoch, last.leader_id, last.server) != (granted.epoch, granted.leader_id, server):
        return granted, [granted], True
    return last, [], True  # the log's last grant is already ours


def log_restarted(
    before: str, now_server: str, server_ms: int, membership: Membership, logger: Any, keys: Keys
) -> list[Event]:
    """The Redis server restarted since the last leader took over, and does not keep every
    acknowledged write (``appendfsync everysec``, or unknown): it may have lost its last
    writes, so nothing that ran across the restart is trusted. The facts to commit with
    the new epoch: every TaskManager registers again (they drop their tasks when they see
    the restart), and every attempt not finished runs again under a number no lost write
    can have used (the server's clock, ``server_ms``: ``LogRestarted``'s floor).

    On a cluster whose server ids name slot ranges, only the slots that failed over
    (``failed_slots``) pay: the jobs whose tag is there (renumbered by the Restorer, from
    ``Membership.restarted``), and the TaskManagers that register again, all of them if the
    cluster's tag is there (its registrations may be lost), else those whose own tag is."""
    floor = max(server_ms, membership.attempt_floor + 1)
    failed = failed_slots(before, now_server) if sharded(now_server) else None
    if failed is None:
        reason = (
            f"the Redis server restarted (run id {before[:8]} -> {now_server[:8]}) and may have lost its last "
            "writes: every task that was not finished runs again"
        )
        if sharded(now_server):
            reason = (
                "a master of the Redis Cluster failed over or restarted and may have lost its last writes "
                "(replication is asynchronous): every task that was not finished runs again"
            )
        logger.warning("log restarted", reason=reason)
        lost: list[Event] = [TaskManagerLost(row.resource_id, row.session, reason) for row in membership.active()]
        return [LogRestarted(before, now_server, floor, reason), *lost]
    return _shards_restarted(before, now_server, floor, failed, membership, logger, keys)


def _shards_restarted(
    before: str, now_server: str, floor: int, failed: Slots, membership: Membership, logger: Any, keys: Keys
) -> list[Event]:
    spans = ", ".join(f"{a}-{b}" for a, b in failed) or "none"
    whole = in_slots(keyslot(keys.cluster), failed)
    reason = (
        f"a master of the Redis Cluster failed over or restarted (slots {spans}) and may have lost its last writes "
        "(replication is asynchronous): the tasks of the jobs there that were not finished run again"
        + (", and every TaskManager registers again (the cluster's tag is there)" if whole else "")
    )
    logger.warning("a shard of the log restarted", reason=reason, slots=spans, cluster_tag=whole)
    lost: list[Event] = [
        TaskManagerLost(row.resource_id, row.session, reason)
        for row in membership.active()
        if whole or in_slots(keyslot(keys.taskmanager(row.resource_id)), failed)
    ]
    return [LogRestarted(before, now_server, floor, reason, [[a, b] for a, b in failed]), *lost]


def rewinds(facts: list[Event], server: str) -> bool:
    """Whether a new leader delivers every outbox again from its first entry (``Committer.rewind``):
    it announces a restart (``facts``) of a log on a cluster (``server``: its masters). One
    shard failed over and lost its last writes, among them, maybe, entries delivered to its
    inboxes from outboxes on other shards, whose cursors are past them. (One Redis loses the
    deliveries with the cursors that moved past them: delivering from the cursor is enough.)"""
    return sharded(server) and any(type(f) is LogRestarted for f in facts)


def reconcile(log: Any, r: Any, server: str, saw_restart: tuple[str, str] | None) -> None:
    """What a failover of one shard cut across tags, told by the side that kept its writes;
    called by a new leader's replay (``Rebuilt`` ``r``) once the cluster's facts are folded,
    on a log on a cluster (``server``) only: one Redis loses a suffix of every tag at once.

    The slots looked at: those that failed over since the last grant (or since this
    JobManager saw them), and those of the log's latest restart (a leader that announced it
    may have died before it got here: looked at again until the next restart).

    * The cluster's tag there: registrations may be lost while the jobs' own facts were
      kept. Every job tag with facts that the cluster's facts do not name is registered
      again (``r.found``: committed at take-over) and rebuilt.
    * A job's tag there: the cluster's tag may say the job ended and was archived while
      its own shard lost the facts of its end (the log says RUNNING, and no leader would
      serve it). Archived jobs there are rebuilt from their own facts: one whose facts say
      it ended is archived again; one whose facts say it runs is served, and as a job of a
      failed shard its unfinished attempts run again, renumbered. Re-running, not
      re-finishing: what it had published stays counted (a sink's newest published attempt
      is the one that counts, and a finished task is not run again), so its output stays
      exactly once, and nothing is made up that its log does not hold (the end's facts are
      gone with the shard; the cluster's archive names only the job)."""
    if not sharded(server):
        return
    keys: Keys = log.keys
    membership: Membership = r.membership
    last = r.last_grant
    before = last.server if last is not None and last.server and last.server != server else None
    if before is None and saw_restart is not None and saw_restart[1] == server:
        before = saw_restart[0]
    slots: Slots = []
    if before is not None:
        fresh = failed_slots(before, server)
        slots += fresh if fresh is not None else [(0, 16383)]
    slots += [(a, b) for a, b, f in membership.restarted if f > 0 and f == membership.attempt_floor]
    if not slots:
        return
    if in_slots(keyslot(keys.cluster), slots):
        known = set(r.registered) | set(r.purged)
        for stream in log.streams():
            tag = tag_of(stream)
            job_id = keys.job_id_of(tag)
            if job_id is None or job_id in known or stream != keys.facts(tag):
                continue
            known.add(job_id)
            r.registered.append(job_id)
            r.found[job_id] = _name(log, stream)
    for job_id in [j for j in r.archived if in_slots(keyslot(keys.job(j)), slots)]:
        r.archived.remove(job_id)


def _name(log: Any, facts: str) -> str:
    """The name a job was submitted with (its first fact), or '' when that is gone."""
    for page in log.replay_pages(facts, "0-0", page=1):
        for _, env in page:
            return env.event.graph.name if isinstance(env.event, JobSubmitted) else ""
    return ""
