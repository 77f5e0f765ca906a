"""The TaskManager's registration state machine, pure: retries with backoff, re-registering
with a new leader, losing the leader, refusals."""

from __future__ import annotations

from sluice.events import (
    AcknowledgeRegistration,
    AlreadyRegistered,
    DisconnectTaskManager,
    JobManagerHeartbeat,
    RefuseRegistration,
    RegisterTaskManager,
    TaskManagerHeartbeat,
)
from sluice.services.taskmanager.core import Registration, RegistrationConfig

CFG = RegistrationConfig(initial_backoff_ms=100, max_backoff_ms=800, heartbeat_interval_ms=50, jobmanager_timeout_ms=300)


def tm() -> Registration:
    return Registration("tm-1", "s1", "host-a", 2, CFG)


def sent(actions: list) -> list[str]:
    return [a.message.TYPE for a in actions]


def test_waits_for_a_leader_then_registers_with_its_epoch() -> None:
    r = tm()
    assert r.tick(0, None, 2) == []
    (action,) = r.tick(10, 4, 2)
    assert isinstance(action.message, RegisterTaskManager) and action.message.epoch == 4
    assert r.state == "REGISTERING"


def test_retries_with_exponential_backoff_until_acknowledged() -> None:
    r = tm()
    times = [t for t in range(0, 5000, 10) if r.tick(t, 1, 2)]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert gaps[:4] == [100, 200, 400, 800] and set(gaps[4:]) == {800}
    r.receive(AcknowledgeRegistration("tm-1", "s1", 1, 50, 300), 5000)
    assert r.state == "REGISTERED" and r.epoch == 1


def test_sends_heartbeats_once_registered() -> None:
    r = tm()
    r.tick(0, 1, 2)
    r.receive(AlreadyRegistered("tm-1", "s1", 1, 50, 300), 0)
    assert sent(r.tick(0, 1, 2)) == ["TaskManagerHeartbeat"]
    assert r.tick(20, 1, 2) == []
    (hb,) = r.tick(50, 1, 1)
    assert hb.message == TaskManagerHeartbeat("tm-1", "s1", 1, 1, [])  # an empty slot report: it holds nothing


def test_registers_again_with_a_new_leader() -> None:
    r = tm()
    r.tick(0, 1, 2)
    r.receive(AcknowledgeRegistration("tm-1", "s1", 1, 50, 300), 0)
    actions = r.receive(JobManagerHeartbeat(2, "jm-b"), 100)
    assert sent(actions) == ["RegisterTaskManager"] and actions[0].message.epoch == 2
    r.receive(AlreadyRegistered("tm-1", "s1", 2, 50, 300), 110)
    assert r.state == "REGISTERED" and r.epoch == 2
    assert r.receive(JobManagerHeartbeat(1, "jm-a"), 120) == []  # a deposed leader is ignored


def test_a_silent_leader_is_given_up_and_registration_starts_again() -> None:
    r = tm()
    r.tick(0, 1, 2)
    r.receive(AcknowledgeRegistration("tm-1", "s1", 1, 50, 300), 0)
    r.receive(JobManagerHeartbeat(1, "jm"), 100)
    r.tick(400, 1, 2)
    assert r.state == "REGISTERED"
    r.tick(401, 1, 2)
    assert r.state == "UNREGISTERED" and "no heartbeat from the leader" in r.history[-1]
    assert sent(r.tick(402, 1, 2)) == ["RegisterTaskManager"]


def test_refusals_retry_or_stop_as_the_leader_says() -> None:
    r = tm()
    r.tick(0, 1, 2)
    r.receive(RefuseRegistration("tm-1", "s1", 2, "wrong epoch", True), 5)
    assert r.state == "UNREGISTERED"
    r.tick(500, 2, 2)
    r.receive(RefuseRegistration("tm-1", "s1", 2, "invalid slot count", False), 505)
    assert r.state == "REFUSED" and r.refusal == "invalid slot count"
    assert r.tick(10_000, 2, 2) == []


def test_replies_to_another_session_are_ignored() -> None:
    r = tm()
    r.tick(0, 1, 2)
    r.receive(AcknowledgeRegistration("tm-1", "old-session", 1, 50, 300), 5)
    assert r.state == "REGISTERING"


def test_a_disconnect_leads_to_registering_again() -> None:
    r = tm()
    r.tick(0, 1, 2)
    r.receive(AcknowledgeRegistration("tm-1", "s1", 1, 50, 300), 0)
    assert sent(r.receive(DisconnectTaskManager("tm-1", "s1", 1, "declared lost"), 10)) == ["RegisterTaskManager"]
