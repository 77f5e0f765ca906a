"""The storage check before submission, pure: the leader tells its root's identity when it
acknowledges a registration, a TaskManager's report of what it sees becomes a membership
fact, and a submission is refused while a registered TaskManager cannot see the root,
naming its host and the path (replayed state equal to live, and the refusal a fold too)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.events import (
    AcknowledgeRegistration,
    AlreadyRegistered,
    LeadershipGranted,
    ReportStorageReach,
    TaskManagerLost,
    TaskManagerRegistered,
    TaskManagerStorageReach,
)
from sluice.services.membership.core import Inbound, Membership, MembershipConfig, decide, evolve
from sluice.services.membership.storage import refusal
from tests.cores import Driven
from tests.helpers import env, register
from tests.services.test_membership_core import assert_replay_and_table_are_live

ROOT, ID = "file:///shared/storage", "root-1"
CONFIG = MembershipConfig(100, 500, 64, ROOT, ID)
PATH = "/shared/storage/_SLUICE_ROOT"


def leader() -> Membership:
    return evolve(Membership(), env(LeadershipGranted(1, "jm", "h")))


def apply(state: Membership, message) -> tuple[Membership, list, list]:
    decision = Driven(decide, state, fold=evolve, folds=True).tell(Inbound(env(message), CONFIG))  # tests/cores.py
    return state, list(decision.facts), [(to.name, reply) for to, reply in decision.sends]


def blind(rid: str = "tm-1", session: str = "s1", root_id: str = ID) -> ReportStorageReach:
    return ReportStorageReach(rid, session, ROOT, root_id, PATH, "missing")


def sees(rid: str = "tm-1", session: str = "s1", root_id: str = ID) -> ReportStorageReach:
    return ReportStorageReach(rid, session, ROOT, root_id, PATH, None)


def test_the_acknowledgement_tells_the_leaders_root_and_its_identity() -> None:
    state, _, replies = apply(leader(), register("tm-1", slots=2))
    assert replies == [("tm-1", AcknowledgeRegistration("tm-1", "s1", 1, 100, 500, ROOT, ID))]
    _, _, replies = apply(state, register("tm-1", slots=2))  # a new leader's, or a lost reply
    assert replies == [("tm-1", AlreadyRegistered("tm-1", "s1", 1, 100, 500, ROOT, ID))]


def test_a_report_becomes_a_fact_once_and_a_repeated_one_changes_nothing() -> None:
    state, _, _ = apply(leader(), register("tm-1", host="host-b"))
    state, facts, replies = apply(state, blind())
    assert facts == [TaskManagerStorageReach("tm-1", "s1", ROOT, ID, PATH, "missing")] and replies == []
    row = state.taskmanagers["tm-1"]
    assert (row.storage_root, row.root_id, row.storage_path, row.storage_problem) == (ROOT, ID, PATH, "missing")
    assert apply(state, blind())[1] == []
    assert apply(state, sees())[1] == [TaskManagerStorageReach("tm-1", "s1", ROOT, ID, PATH, None)]
    assert state.taskmanagers["tm-1"].sees_root(ROOT, ID) is True


def test_a_report_of_a_session_that_is_not_registered_is_void() -> None:
    state, _, _ = apply(leader(), register("tm-1"))
    assert apply(state, blind("tm-1", "s-old"))[1] == []
    assert apply(state, blind("tm-9"))[1] == []
    assert state.taskmanagers["tm-1"].sees_root(ROOT, ID) is None


def test_a_taskmanager_that_cannot_see_the_root_refuses_submissions_naming_its_host_and_the_path() -> None:
    state, _, _ = apply(leader(), register("tm-1", host="host-a"))
    state, _, _ = apply(state, register("tm-2", host="host-b"))
    apply(state, sees("tm-1"))
    assert refusal(state, ROOT, ID) is None
    apply(state, blind("tm-2"))
    why = refusal(state, ROOT, ID)
    assert why is not None
    assert why.startswith(f"TaskManager tm-2 on host host-b cannot see the storage root {ROOT} ({PATH}: missing)")
    assert "README 'Across hosts'" in why and "tm-1" not in why


def test_what_does_not_block_a_submission() -> None:
    state, _, _ = apply(leader(), register("tm-1", host="host-a"))
    assert refusal(state, ROOT, ID) is None  # registered, not reported yet: its first task checks
    apply(state, blind("tm-1", root_id="another-root"))
    assert refusal(state, ROOT, ID) is None  # a report on another leader's root says nothing of this one
    apply(state, blind("tm-1"))
    assert refusal(state, ROOT, ID) is not None
    assert refusal(state, ROOT, "") is None  # a leader whose root has no identity asks nothing
    evolve(state, env(TaskManagerLost("tm-1", "s1", "no heartbeat")))
    assert refusal(state, ROOT, ID) is None  # a TaskManager that is gone is not asked
    apply(state, register("tm-1", "s2", host="host-a"))
    assert refusal(state, ROOT, ID) is None  # its new session has not reported yet


# --- the law: the log is the state, and the refusal a fold of it ---------------------------------

rids = st.sampled_from(["tm-1", "tm-2"])
sessions = st.sampled_from(["s1", "s2"])
root_ids = st.sampled_from([ID, "root-2"])
messages = st.one_of(
    st.builds(register, rids, sessions, slots=st.just(1), epoch=st.just(1), host=st.sampled_from(["h1", "h2"])),
    st.builds(
        lambda r, s, i, p: ReportStorageReach(r, s, ROOT, i, PATH, p),
        rids,
        sessions,
        root_ids,
        st.sampled_from([None, "missing", "unreadable"]),
    ),
    st.builds(lambda r, s: TaskManagerLost(r, s, "timeout"), rids, sessions),
)


@settings(max_examples=300)
@given(st.lists(messages, max_size=40))
def test_replay_equals_live_and_a_refusal_names_exactly_the_registered_taskmanagers_that_cannot_see(
    sequence: list,
) -> None:
    live = leader()
    log = [env(LeadershipGranted(1, "jm", "h"))]
    reported: dict[str, tuple[str, str | None]] = {}  # the last report of each registered session, by rid
    for i, msg in enumerate(sequence):
        facts = (msg,) if isinstance(msg, TaskManagerLost) else decide(live, Inbound(env(msg, ts=i), CONFIG), i).facts
        if isinstance(msg, ReportStorageReach) and live.is_registered(msg.resource_id, msg.session):
            reported[msg.resource_id] = (msg.root_id, msg.problem)
        for fact in facts:
            e = env(fact, ts=i)
            log.append(e)
            evolve(live, e)
            if isinstance(fact, TaskManagerRegistered):  # a new session has said nothing yet
                reported.pop(fact.resource_id, None)
    assert_replay_and_table_are_live(log, live)
    expected = sorted(
        rid
        for rid, (root_id, problem) in reported.items()
        if live.taskmanagers[rid].status == "REGISTERED" and root_id == ID and problem is not None
    )
    why = refusal(live, ROOT, ID)
    named = sorted(r for r in ("tm-1", "tm-2") if why is not None and f"TaskManager {r} on host" in why)
    assert named == expected
    assert (why is None) == (not expected)
