"""Snapshots in the pure layer: the codec round-trips exactly, and a state rebuilt from a
snapshot plus the facts after it equals the full fold of the log (driven by the jobs core's
own state machine, tests/services/test_jobs_model.py)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import rule

from sluice.events import Envelope, LeadershipGranted, TaskManagerLost, TaskManagerRegistered
from sluice.services.jobmanager.snapshot_codec import (
    VERSION,
    ClusterSnapshot,
    SnapshotUnreadable,
    decode_cluster,
    decode_job,
    encode_cluster,
    encode_job,
    install_job,
    job_snapshot,
)
from sluice.services.jobs.state import JobsState, evolve
from sluice.services.membership import core as membership
from tests.services.test_jobs_model import JobsMachine


def same(a: JobsState, b: JobsState) -> None:
    """Exactly the same state: every job's dataclasses (ready queue and stories included) and
    the slot pool (a TaskManager with nothing held counts as absent)."""
    assert a.jobs.keys() == b.jobs.keys()
    for job_id in a.jobs:
        assert a.jobs[job_id] == b.jobs[job_id], job_id
    assert a.pool.holders() == b.pool.holders()
    assert {k: v for k, v in a.pool.by_taskmanager.items() if v} == {
        k: v for k, v in b.pool.by_taskmanager.items() if v
    }


class SnapshotMachine(JobsMachine):
    """The jobs machine, plus: at any point, snapshot every job after the first ``k`` decisions
    of the log, decode, fold the rest, and compare with the full fold."""

    @rule(i=st.integers(0, 10_000))
    def snapshot_and_tail_equal_a_full_fold(self, i: int) -> None:
        k = i % (len(self.decisions) + 1)
        head = JobsState()
        for _, now, facts in self.decisions[:k]:
            for fact in facts:
                evolve(head, Envelope(fact, "", 0, now))
        rebuilt = JobsState()
        for job_id in head.jobs:
            data = encode_job(job_snapshot(head, job_id))
            snap = decode_job(data, job_id)
            assert encode_job(snap) == data  # a fixed point: nothing lost, nothing added
            install_job(rebuilt, snap)
        for _, now, facts in self.decisions[k:]:
            for fact in facts:
                evolve(rebuilt, Envelope(fact, "", 0, now))
        same(rebuilt, self.fold())


TestSnapshotModel = SnapshotMachine.TestCase
TestSnapshotModel.settings = settings(
    max_examples=40, stateful_step_count=40, deadline=None, suppress_health_check=list(HealthCheck)
)


RIDS = st.sampled_from(["tm-a", "tm-b", "tm-c"])
CLUSTER_FACTS = st.one_of(
    st.builds(
        TaskManagerRegistered,
        RIDS,
        st.sampled_from(["s1", "s2"]),
        st.text(max_size=8),
        st.integers(1, 8),
        st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2),
    ),
    st.builds(TaskManagerLost, RIDS, st.sampled_from(["s1", "s2"]), st.text(max_size=20)),
    st.builds(
        LeadershipGranted, st.integers(1, 9), st.text(min_size=1, max_size=6), st.text(max_size=6), st.text(max_size=8)
    ),
)


@settings(max_examples=200, deadline=None)
@given(
    facts=st.lists(CLUSTER_FACTS, max_size=30),
    split=st.integers(0, 30),
    registered=st.lists(st.text(min_size=1, max_size=8), max_size=5),
    archived=st.integers(0, 5),
)
def test_the_cluster_snapshot_and_its_tail_fold_to_the_full_membership(facts, split, registered, archived) -> None:
    full, head = membership.Membership(), membership.Membership()
    envs = [Envelope(f, "x", 0, 1000 + i) for i, f in enumerate(facts)]
    for env in envs:
        membership.evolve(full, env)
    for env in envs[:split]:
        membership.evolve(head, env)
    grant = next((f for f in reversed(facts[:split]) if isinstance(f, LeadershipGranted)), None)
    snap = ClusterSnapshot(head, registered, grant, registered[:archived])
    back = decode_cluster(encode_cluster(snap))
    assert (back.registered, back.archived, back.last_grant) == (registered, registered[:archived], grant)
    for env in envs[split:]:
        membership.evolve(back.membership, env)
    assert back.membership == full


@pytest.mark.parametrize(
    "data, why",
    [
        (b"\x00not json", "not JSON"),
        (b'{"v": 1, "kind": "cluster"}', "KeyError"),
        (b'{"v": 999, "kind": "job", "job_id": "j"}', "schema version 999"),
        (
            b'{"v": 1, "kind": "cluster", "membership": {}, "registered": [], "archived": [], "last_grant": null}',
            "KeyError",
        ),
        (b"[1, 2]", "not a job snapshot"),
    ],
)
def test_an_unreadable_snapshot_says_why_and_never_crashes(data: bytes, why: str) -> None:
    with pytest.raises(SnapshotUnreadable, match=why):
        (decode_cluster if b"cluster" in data else decode_job)(data)
    assert VERSION == 1


def test_a_snapshot_from_before_v2_waits_holds_a_wait_that_ends_at_the_next_slot_taken() -> None:
    """A snapshot written before JobWaitingForSlots v2 has no ``wait_until_placed`` nor
    ``slot_taken_at``: its open wait was recorded as a v1 fact, so it is read as one."""
    import orjson

    from sluice.api import Job
    from sluice.events import SubmitJob
    from sluice.services.jobs import core

    j = Job("many")
    j.read_text("lines", "/data/in.txt", parallelism=3).write_parquet("out", "/data/out")
    state = JobsState()
    splits = {"lines": [{"path": "/data/in.txt", "start": 0, "end": 1, "index": 0}]}
    submitted = core.Submit(SubmitJob("j1", j.graph(), "blob", "mod", "client-inbox"), splits, "file:///s")
    for d in (core.decide(state, submitted, 1_000), core.decide(state, core.Schedule("j1", {}), 1_000)):
        for fact in d.facts:
            evolve(state, Envelope(fact, "", 0, 1_000))
    assert state.jobs["j1"].waiting_since == 1_000 and state.jobs["j1"].wait_until_placed
    raw = orjson.loads(encode_job(job_snapshot(state, "j1")))
    for key in ("wait_until_placed", "slot_taken_at"):
        del raw["run"][key]
    job = decode_job(orjson.dumps(raw), "j1").run
    assert job is not None
    assert (job.waiting_since, job.wait_until_placed, job.slot_taken_at) == (1_000, False, None)
