"""The membership core, pure: every registration outcome, heartbeats, leaving, and the
law that replaying the facts gives the live state."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.events import (
    AcknowledgeRegistration,
    AlreadyRegistered,
    DisconnectTaskManager,
    LeadershipGranted,
    RefuseRegistration,
    SubmitTask,
    TaskManagerLost,
    TaskManagerRegistered,
    TaskManagerUnregistered,
    UnregisterTaskManager,
)
from sluice.services.membership.core import (
    Decision,
    HeartbeatMonitor,
    Inbound,
    Membership,
    MembershipConfig,
    Timeouts,
    UnexpectedMessage,
    decide,
    evolve,
)
from sluice.services.projector.core import TASKMANAGERS
from tests.cores import Driven
from tests.helpers import env, heartbeat, register

CONFIG = MembershipConfig(heartbeat_interval_ms=100, heartbeat_timeout_ms=500, max_slots=64)


def assert_replay_and_table_are_live(log: list, live: Membership) -> None:
    """A fresh fold of ``log`` is ``live``; the projector folds with the same evolve, and its
    table loads back to the same rows."""
    replayed = Membership()
    for e in log:
        evolve(replayed, e)
    assert replayed == live
    projected = TASKMANAGERS.initial()
    for e in log:
        TASKMANAGERS.evolve(projected, e)
    rows = {k: TASKMANAGERS.row(projected, k) for k in projected.taskmanagers}
    assert TASKMANAGERS.load(rows).taskmanagers == live.taskmanagers


def leader(epoch: int = 1) -> Membership:
    return evolve(Membership(), env(LeadershipGranted(epoch, "jm", "h")))


def replies(decision: Decision) -> tuple:
    """The decision's replies, (resource id, reply) each (every send of membership goes to a TaskManager)."""
    assert all(to.kind == "taskmanager" for to, _ in decision.sends)
    return tuple((to.name, reply) for to, reply in decision.sends)


def apply(state: Membership, message) -> tuple[Membership, list]:
    """Decide on a message, fold its facts, return the replies (the shell's job, minus Redis:
    the one fixture, tests/cores.py)."""
    decision = Driven(decide, state, fold=evolve, folds=True).tell(Inbound(env(message), CONFIG))
    return state, list(replies(decision))


def test_first_registration_is_acknowledged_and_recorded() -> None:
    state, replies = apply(leader(), register("tm-1", slots=4))
    assert replies == [("tm-1", AcknowledgeRegistration("tm-1", "s1", 1, 100, 500))]
    row = state.taskmanagers["tm-1"]
    assert (row.status, row.slots, row.host) == ("REGISTERED", 4, "host-a")
    assert state.total_slots == 4


def test_the_same_session_registering_again_is_already_registered() -> None:
    state, _ = apply(leader(), register())
    before = state.taskmanagers["tm-1"].since
    decision = decide(state, Inbound(env(register()), CONFIG), 0)
    assert decision.facts == []
    assert replies(decision) == (("tm-1", AlreadyRegistered("tm-1", "s1", 1, 100, 500)),)
    assert state.taskmanagers["tm-1"].since == before


def test_a_restarted_taskmanager_replaces_its_old_session() -> None:
    state, _ = apply(leader(), register(session="old"))
    decision = decide(state, Inbound(env(register(session="new")), CONFIG), 0)
    assert [type(f) for f in decision.facts] == [TaskManagerLost, TaskManagerRegistered]
    assert "restarted" in decision.facts[0].reason
    assert isinstance(replies(decision)[0][1], AcknowledgeRegistration)


@pytest.mark.parametrize(
    "message, says, retry",
    [
        (register(protocol=99), "protocol version mismatch: the TaskManager speaks 99", False),
        (register(slots=0), "invalid slot count 0: a TaskManager offers 1 to 64 slots", False),
        (register(slots=65), "invalid slot count 65", False),
        (register(host="  "), "empty host name", False),
        (register(epoch=0), "addressed to the leader of epoch 0, but the leader is at epoch 1", True),
    ],
)
def test_registrations_that_cannot_be_accepted_are_refused_with_a_reason(message, says: str, retry: bool) -> None:
    state = leader()
    decision = decide(state, Inbound(env(message), CONFIG), 0)
    assert decision.facts == []
    ((target, reply),) = replies(decision)
    assert target == message.resource_id and isinstance(reply, RefuseRegistration)
    assert says in reply.reason and reply.retry is retry
    assert state.taskmanagers == {}


def test_a_registration_for_a_deposed_leaders_epoch_is_refused() -> None:
    state, _ = apply(leader(1), register(epoch=1))
    evolve(state, env(LeadershipGranted(2, "jm-2", "h")))
    ((_, reply),) = replies(decide(state, Inbound(env(register(epoch=1)), CONFIG), 0))
    assert isinstance(reply, RefuseRegistration) and reply.retry and "epoch 2" in reply.reason
    ((_, reply),) = replies(decide(state, Inbound(env(register(epoch=2)), CONFIG), 0))
    assert isinstance(reply, AlreadyRegistered) and reply.epoch == 2


def test_heartbeats_from_unknown_taskmanagers_are_told_to_register_again() -> None:
    state, _ = apply(leader(), register())
    assert replies(decide(state, Inbound(env(heartbeat()), CONFIG), 0)) == ()
    ((_, reply),) = replies(decide(state, Inbound(env(heartbeat(session="other")), CONFIG), 0))
    assert isinstance(reply, DisconnectTaskManager) and "register again" in reply.reason


def test_missed_heartbeats_make_a_taskmanager_lost() -> None:
    state, _ = apply(leader(), register("tm-1"))
    apply(state, register("tm-2"))
    monitor = HeartbeatMonitor()
    monitor.restart(state, now=1000)
    monitor.observe("tm-2", 1400)
    assert decide(state, Timeouts(monitor, CONFIG), 1500).facts == []
    (lost,) = decide(state, Timeouts(monitor, CONFIG), 1501).facts
    assert lost == TaskManagerLost("tm-1", "s1", "no heartbeat for 501 ms (timeout 500 ms)")
    evolve(state, env(lost))
    assert [r.resource_id for r in state.active()] == ["tm-2"]
    assert state.taskmanagers["tm-1"].status == "LOST"


def test_graceful_leave_and_leaving_twice() -> None:
    state, _ = apply(leader(), register())
    decision = decide(state, Inbound(env(UnregisterTaskManager("tm-1", "s1", "bye")), CONFIG), 0)
    assert decision.facts == [TaskManagerUnregistered("tm-1", "s1", "bye")]
    evolve(state, env(decision.facts[0]))
    assert state.taskmanagers["tm-1"].status == "UNREGISTERED"
    assert decide(state, Inbound(env(UnregisterTaskManager("tm-1", "s1", "bye")), CONFIG), 0).facts == []


def test_a_lost_taskmanager_can_register_again() -> None:
    state, _ = apply(leader(), register())
    evolve(state, env(TaskManagerLost("tm-1", "s1", "timeout")))
    state, replies = apply(state, register())
    assert isinstance(replies[0][1], AcknowledgeRegistration)
    assert state.taskmanagers["tm-1"].status == "REGISTERED"


def test_messages_the_cluster_inbox_does_not_take_are_named() -> None:
    """Refused, not raised (the door never raises): the shell parks it with the reason."""
    decision = decide(leader(), Inbound(env(SubmitTask("j", "x", "v", 0, 0, 0, {})), CONFIG), 0)
    with pytest.raises(UnexpectedMessage, match="SubmitTask is not a message the JobManager takes"):
        raise decision.rejected or AssertionError("not rejected")
    assert (decision.facts, decision.sends) == ([], [])


# --- the law: the log is the state -----------------------------------------------------------

rids = st.sampled_from(["tm-1", "tm-2", "tm-3"])
sessions = st.sampled_from(["s1", "s2"])
messages = st.one_of(
    st.builds(register, rids, sessions, slots=st.integers(-1, 70), epoch=st.integers(1, 3)),
    st.builds(heartbeat, rids, sessions),
    st.builds(UnregisterTaskManager, rids, sessions, st.just("bye")),
    st.builds(lambda e: LeadershipGranted(e, f"jm-{e}", "h"), st.integers(1, 3)),
    st.builds(lambda r, s: TaskManagerLost(r, s, "timeout"), rids, sessions),
)


@settings(max_examples=300)
@given(st.lists(messages, max_size=40))
def test_replaying_the_facts_gives_the_live_state_and_the_projected_table(sequence: list) -> None:
    live = Membership()
    log: list = []
    for i, msg in enumerate(sequence):
        if isinstance(msg, (LeadershipGranted, TaskManagerLost)):
            facts = (msg,)  # facts the shell decides from leadership and timers
        else:
            facts = decide(live, Inbound(env(msg, ts=i), CONFIG), i).facts
        for fact in facts:
            e = env(fact, ts=i)
            log.append(e)
            evolve(live, e)
    assert_replay_and_table_are_live(log, live)
    # Invariant: a resource id is registered at most once, with a valid slot count.
    assert all(1 <= r.slots <= CONFIG.max_slots for r in live.active())
