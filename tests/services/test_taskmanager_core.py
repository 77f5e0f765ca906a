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
from sluice.services.taskmanager.core import Registration, RegistrationConfig, Tick, decide

CFG = RegistrationConfig(
    initial_backoff_ms=100, max_backoff_ms=800, heartbeat_interval_ms=50, jobmanager_timeout_ms=300
)


def tm() -> Registration:
    return Registration("tm-1", "s1", "host-a", 2, CFG)


def sent(actions: list) -> list[str]:
    return [a.event.TYPE for a in actions]


def test_waits_for_a_leader_then_registers_with_its_epoch() -> None:
    r = tm()
    assert decide(r, Tick(None, 2), 0).sends == []
    (action,) = decide(r, Tick(4, 2), 10).sends
    assert isinstance(action.event, RegisterTaskManager) and action.event.epoch == 4
    assert r.state == "REGISTERING"


def test_retries_with_exponential_backoff_until_acknowledged() -> None:
    r = tm()
    times = [t for t in range(0, 5000, 10) if decide(r, Tick(1, 2), t).sends]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert gaps[:4] == [100, 200, 400, 800] and set(gaps[4:]) == {800}
    decide(r, AcknowledgeRegistration("tm-1", "s1", 1, 50, 300), 5000)
    assert r.state == "REGISTERED" and r.epoch == 1


def test_sends_heartbeats_once_registered() -> None:
    r = tm()
    decide(r, Tick(1, 2), 0)
    decide(r, AlreadyRegistered("tm-1", "s1", 1, 50, 300), 0)
    assert sent(decide(r, Tick(1, 2), 0).sends) == ["TaskManagerHeartbeat"]
    assert decide(r, Tick(1, 2), 20).sends == []
    (hb,) = decide(r, Tick(1, 1), 50).sends
    assert hb.event == TaskManagerHeartbeat("tm-1", "s1", 1, 1, [])  # an empty slot report: it holds nothing


def test_registers_again_with_a_new_leader() -> None:
    r = tm()
    decide(r, Tick(1, 2), 0)
    decide(r, AcknowledgeRegistration("tm-1", "s1", 1, 50, 300), 0)
    actions = decide(r, JobManagerHeartbeat(2, "jm-b"), 100).sends
    assert sent(actions) == ["RegisterTaskManager"] and actions[0].event.epoch == 2
    decide(r, AlreadyRegistered("tm-1", "s1", 2, 50, 300), 110)
    assert r.state == "REGISTERED" and r.epoch == 2
    assert decide(r, JobManagerHeartbeat(1, "jm-a"), 120).sends == []  # a deposed leader is ignored


def test_a_silent_leader_is_given_up_and_registration_starts_again() -> None:
    r = tm()
    decide(r, Tick(1, 2), 0)
    decide(r, AcknowledgeRegistration("tm-1", "s1", 1, 50, 300), 0)
    decide(r, JobManagerHeartbeat(1, "jm"), 100)
    decide(r, Tick(1, 2), 400)
    assert r.state == "REGISTERED"
    decide(r, Tick(1, 2), 401)
    assert r.state == "UNREGISTERED" and "no heartbeat from the leader" in r.history[-1]
    assert sent(decide(r, Tick(1, 2), 402).sends) == ["RegisterTaskManager"]


def test_refusals_retry_or_stop_as_the_leader_says() -> None:
    r = tm()
    decide(r, Tick(1, 2), 0)
    decide(r, RefuseRegistration("tm-1", "s1", 2, "wrong epoch", True), 5)
    assert r.state == "UNREGISTERED"
    decide(r, Tick(2, 2), 500)
    decide(r, RefuseRegistration("tm-1", "s1", 2, "invalid slot count", False), 505)
    assert r.state == "REFUSED" and r.refusal == "invalid slot count"
    assert decide(r, Tick(2, 2), 10_000).sends == []


def test_replies_to_another_session_are_ignored() -> None:
    r = tm()
    decide(r, Tick(1, 2), 0)
    decide(r, AcknowledgeRegistration("tm-1", "old-session", 1, 50, 300), 5)
    assert r.state == "REGISTERING"


def test_a_disconnect_leads_to_registering_again() -> None:
    r = tm()
    decide(r, Tick(1, 2), 0)
    decide(r, AcknowledgeRegistration("tm-1", "s1", 1, 50, 300), 0)
    assert sent(decide(r, DisconnectTaskManager("tm-1", "s1", 1, "declared lost"), 10).sends) == ["RegisterTaskManager"]
