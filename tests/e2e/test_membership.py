"""Membership with real processes on real Redis: every registration outcome, heartbeat loss,
graceful leave, bad input in the inbox, and Redis going away."""

from __future__ import annotations

import re
import signal
import time

import pytest

from sluice.events import (
    AcknowledgeRegistration,
    AlreadyRegistered,
    Envelope,
    JobManagerHeartbeat,
    LeadershipGranted,
    RefuseRegistration,
    SubmitTask,
    TaskDeploymentDescriptor,
    TaskManagerHeartbeat,
    TaskManagerLost,
    TaskManagerUnregistered,
)
from sluice.services.projector import Projector
from sluice.services.projector.core import TASKMANAGERS
from sluice.store import EventLog, Keys, ReadModels, connect, current_leader
from tests.e2e.conftest import MARGIN, TEARDOWN, Processes, facts, membership, registered, wait_until
from tests.helpers import env, register


def leader_epoch(log: EventLog) -> int:
    holder = wait_until(lambda: current_leader(log), "a leader")
    return holder.epoch


def replies(log: EventLog, rid: str) -> list[Envelope]:
    return [e for _, e in log.replay(log.keys.inbox(log.keys.taskmanager(rid))) if e.type != "JobManagerHeartbeat"]


@pytest.mark.timeout(20 + 20 + MARGIN + TEARDOWN)
def test_taskmanagers_register_and_the_table_is_the_fold_of_the_log(procs: Processes, log: EventLog) -> None:
    procs.start("jm", "jobmanager")
    procs.start("projector", "projector")
    procs.start("tm1", "taskmanager", "--resource-id", "tm-1", "--slots", "2")
    procs.start("tm2", "taskmanager", "--resource-id", "tm-2", "--slots", "3")
    wait_until(
        lambda: registered(log) == {"tm-1", "tm-2"} and all(r.root_id for r in membership(log).active()),
        "two registrations, and what each sees of the storage root (the last change to their rows)",
    )
    assert membership(log).total_slots == 5
    # One acknowledgement; a registration retried while the leader was busy (it retries after
    # 100 ms, doubling, as Flink's does) is answered AlreadyRegistered, never a second ack.
    got = [type(e.event) for e in replies(log, "tm-1")]
    assert got[0] is AcknowledgeRegistration and set(got[1:]) <= {AlreadyRegistered}, got
    # The projector's table is the live fold; a projector rebuilding from scratch agrees.
    tables = ReadModels(log)
    live = {k: TASKMANAGERS.row(membership(log), k) for k in membership(log).taskmanagers}
    wait_until(lambda: tables.read(log.keys.cluster, "taskmanagers")[1] == live, "the projector to catch up")
    log.client.delete(
        log.keys.table(log.keys.cluster, "taskmanagers"), log.keys.position(log.keys.cluster, "taskmanagers")
    )
    Projector(log).catch_up()
    assert tables.read(log.keys.cluster, "taskmanagers")[1] == live


@pytest.mark.timeout(20 + 20 + MARGIN + TEARDOWN)
def test_a_repeated_registration_gets_already_registered(procs: Processes, log: EventLog) -> None:
    procs.start("jm", "jobmanager")
    epoch = leader_epoch(log)
    inbox = log.keys.inbox(log.keys.cluster)
    log.append(inbox, env(register("tm-x", "sess", epoch=epoch)))
    log.append(inbox, env(register("tm-x", "sess", epoch=epoch)))  # e.g. the first reply was lost
    got = wait_until(lambda: len(r := replies(log, "tm-x")) == 2 and r, "two replies")
    assert [type(e.event) for e in got] == [AcknowledgeRegistration, AlreadyRegistered]
    assert sum(e.type == "TaskManagerRegistered" for e in facts(log)) == 1


@pytest.mark.timeout(20 + 20 + 20 + MARGIN + TEARDOWN)
def test_refused_registrations_say_why(procs: Processes, log: EventLog) -> None:
    procs.start("jm", "jobmanager")
    epoch = leader_epoch(log)
    inbox = log.keys.inbox(log.keys.cluster)
    log.append(inbox, env(register("tm-old", epoch=epoch, protocol=0)))
    log.append(inbox, env(register("tm-stale", epoch=epoch + 5)))
    wait_until(lambda: replies(log, "tm-old") and replies(log, "tm-stale"), "refusals")
    old, stale = replies(log, "tm-old")[0].event, replies(log, "tm-stale")[0].event
    assert isinstance(old, RefuseRegistration) and "protocol version mismatch" in old.reason and not old.retry
    assert isinstance(stale, RefuseRegistration) and f"leader is at epoch {epoch}" in stale.reason and stale.retry
    # A real TaskManager refused for good exits non-zero and says why.
    tm = procs.start("tm0", "taskmanager", "--resource-id", "tm-0", "--slots", "0")
    assert tm.wait(timeout=20) == 2
    assert "invalid slot count 0" in procs.output("tm0")
    assert registered(log) == set()


@pytest.mark.timeout(20 + 20 + 1 + MARGIN + TEARDOWN)
def test_a_killed_taskmanager_is_lost_after_the_heartbeat_timeout(procs: Processes, log: EventLog) -> None:
    procs.start("jm", "jobmanager")
    procs.start("tm1", "taskmanager", "--resource-id", "tm-1")
    procs.start("tm2", "taskmanager", "--resource-id", "tm-2")
    wait_until(lambda: registered(log) == {"tm-1", "tm-2"}, "registrations")
    procs.signal("tm1", signal.SIGKILL)
    lost = wait_until(lambda: [e.event for e in facts(log) if isinstance(e.event, TaskManagerLost)], "TaskManagerLost")
    assert lost[0].resource_id == "tm-1"
    silent_ms = int(re.match(r"no heartbeat for (\d+) ms \(timeout 800 ms\)", lost[0].reason).group(1))
    assert silent_ms > 800  # not before the timeout
    assert registered(log) == {"tm-2"}
    time.sleep(1.0)
    assert registered(log) == {"tm-2"}  # the living one keeps its heartbeats going


@pytest.mark.timeout(20 + 10 + 20 + MARGIN + TEARDOWN)
def test_a_stopped_taskmanager_unregisters(procs: Processes, log: EventLog) -> None:
    procs.start("jm", "jobmanager")
    tm = procs.start("tm1", "taskmanager", "--resource-id", "tm-1")
    wait_until(lambda: registered(log) == {"tm-1"}, "registration")
    procs.signal("tm1", signal.SIGTERM)
    assert tm.wait(timeout=10) == 0
    gone = wait_until(lambda: [e.event for e in facts(log) if isinstance(e.event, TaskManagerUnregistered)], "goodbye")
    assert gone[0].reason == "stopped gracefully"
    assert not any(isinstance(e.event, TaskManagerLost) for e in facts(log))


@pytest.mark.timeout(20 + 20 + MARGIN + TEARDOWN)
def test_a_taskmanager_started_later_joins_the_pool(procs: Processes, log: EventLog) -> None:
    procs.start("jm", "jobmanager")
    procs.start("tm1", "taskmanager", "--resource-id", "tm-1", "--slots", "2")
    wait_until(lambda: registered(log) == {"tm-1"}, "first")
    procs.start("tm2", "taskmanager", "--resource-id", "tm-2", "--slots", "4")
    wait_until(lambda: registered(log) == {"tm-1", "tm-2"}, "second")
    assert membership(log).total_slots == 6


@pytest.mark.timeout(20 + 20 + MARGIN + TEARDOWN)
def test_bad_entries_in_the_inbox_are_parked_and_the_jobmanager_goes_on(procs: Processes, log: EventLog) -> None:
    jm = procs.start("jm", "jobmanager")
    leader_epoch(log)
    inbox = log.keys.inbox(log.keys.cluster)
    log.client.xadd(inbox, {b"e": b"definitely not json"})
    log.client.xadd(inbox, {b"payload": b"{}"})
    log.client.xadd(
        inbox, {b"e": b'{"type":"Mystery","v":1,"id":"i","job":null,"epoch":0,"ts":0,"cause":null,"payload":{}}'}
    )
    log.client.xadd(
        inbox,
        {
            b"e": b'{"type":"RegisterTaskManager","v":2,"id":"i","job":null,"epoch":0,"ts":0,"cause":null,"payload":{"slots":2}}'
        },
    )
    task = TaskDeploymentDescriptor("j", "v:0:0", "v", 0, 0, 1, 128, "noop", "0" * 64, "m", [], {}, [])
    log.append(inbox, env(SubmitTask("j", "v:0:0", "v", 0, 0, 0, task)))  # well-formed, wrong inbox
    procs.start("tm1", "taskmanager", "--resource-id", "tm-1")
    wait_until(lambda: registered(log) == {"tm-1"}, "a registration after the bad entries")
    dead = [f for _, f in log.replay_raw(log.keys.dead(log.keys.cluster))]
    kinds = [f[b"kind"].decode() for f in dead]
    assert kinds == ["not JSON", "malformed envelope", "unknown event type", "missing field", "rejected"]
    assert b"not a message the JobManager takes" in dead[-1][b"reason"]
    assert all(f[b"stream"].decode() == inbox for f in dead)
    assert jm.poll() is None
    assert log.client.xpending(inbox, "jobmanager")["pending"] == 0


@pytest.mark.timeout(20 + 20 + 10 + 1 + 10 + 4 * 30 + 1 + MARGIN + TEARDOWN)  # stop and start: 10 s each
def test_the_cluster_rides_out_a_redis_restart(procs: Processes, aof_redis, prefix: str) -> None:
    """Redis stops for a second and comes back on its AOF. The old rows alone (a leader, a
    registered TaskManager) prove nothing: the cluster must work again on the restarted
    server, so a leader is granted at a new epoch, the TaskManager registers with it, and
    heartbeats flow both ways at that epoch, with nobody declared lost."""
    url = aof_redis.url
    log = EventLog(connect(url), Keys(prefix))
    jm = procs.start("jm", "jobmanager", url=url)
    tm = procs.start("tm1", "taskmanager", "--resource-id", "tm-1", url=url)
    wait_until(lambda: registered(log) == {"tm-1"}, "registration")
    before = leader_epoch(log)
    aof_redis.stop()
    time.sleep(1.0)
    assert jm.poll() is None and tm.poll() is None  # nobody died
    restarted_ms = int(time.time() * 1000)  # the same clock as the local server's entry ids
    aof_redis.start()
    log = EventLog(connect(url), log.keys)
    after = f"{restarted_ms}-0"

    def since_restart(stream: str) -> list[Envelope]:
        return [e for _, e in log.replay(stream, after)]

    grant = wait_until(
        lambda: next(
            (e for e in since_restart(log.keys.facts(log.keys.cluster)) if isinstance(e.event, LeadershipGranted)), None
        ),
        "a leader granted after the restart",
        timeout=30,
    )
    epoch = grant.event.epoch
    assert epoch > before and grant.epoch == epoch and current_leader(log).epoch == epoch
    tm_inbox = log.keys.inbox(log.keys.taskmanager("tm-1"))
    # (An answer the old leader committed before the restart may be delivered after it, by
    # the new leader's outbox delivery: it keeps its epoch, and the TaskManager ignores it.)
    reply = wait_until(
        lambda: next(
            (
                e
                for e in since_restart(tm_inbox)
                if isinstance(e.event, (AlreadyRegistered, AcknowledgeRegistration)) and e.event.epoch == epoch
            ),
            None,
        ),
        "tm-1 to register with the new leader",
        timeout=30,
    )
    assert reply.epoch == epoch, reply
    # Heartbeats at the new epoch, both ways, well past the heartbeat timeout (800 ms).
    wait_until(
        lambda: (
            len(
                [
                    e
                    for e in since_restart(tm_inbox)
                    if isinstance(e.event, JobManagerHeartbeat) and e.event.epoch == epoch
                ]
            )
            >= 10
        ),
        "the new leader's heartbeats to tm-1",
        timeout=30,
    )
    wait_until(
        lambda: (
            len(
                [
                    e
                    for e in since_restart(log.keys.inbox(log.keys.cluster))
                    if isinstance(e.event, TaskManagerHeartbeat)
                    and e.event.resource_id == "tm-1"
                    and e.event.epoch == epoch
                ]
            )
            >= 10
        ),
        "tm-1's heartbeats to the new leader",
        timeout=30,
    )
    time.sleep(1.0)
    assert registered(log) == {"tm-1"}
    assert not any(isinstance(e.event, TaskManagerLost) for e in facts(log))
    assert all(e.epoch == epoch for e in since_restart(log.keys.facts(log.keys.cluster)))
    for name in ("jm", "tm1"):  # one line when Redis goes, one when it is back, not one per retry
        out = procs.output(name)
        assert out.count("Redis is away") == 1 and out.count("Redis is back") == 1, out[-3000:]
    assert jm.poll() is None and tm.poll() is None
