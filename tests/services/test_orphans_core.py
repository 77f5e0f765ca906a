"""Orphaned attempts, pure (services/jobs/core.py ``orphans``): an attempt holding a slot
on a TaskManager registration that a committed loss ended fails when its job is taken
over or joins, even when the TaskManager registered again under the same session, and
whichever leader committed the loss (issue 28, finding 3). Told apart by epochs, a fold
of the log: the attempt's placement fact's epoch against the epoch its TaskManager's
current registration began at."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sluice.events import Envelope, SubmitJob, TaskManagerLost, TaskManagerRegistered, TaskState
from sluice.services.jobmanager.snapshot_codec import decode_job, encode_job, install_job, job_snapshot
from sluice.services.jobs import core
from sluice.services.jobs.state import JobsState, evolve
from sluice.services.membership.core import Membership
from sluice.services.membership.core import evolve as members_evolve
from tests.cores import CFG
from tests.services.test_jobs_core import copy_job


def placed_at(epoch: int) -> JobsState:
    """Job ``j1``'s one attempt placed on tm-1 (session s1) by the leader of ``epoch``, as a
    replay of its facts has it."""
    live = JobsState()
    splits = {"lines": [{"path": "/data/in.txt", "start": 0, "end": 1, "index": 0}]}
    submitted = core.Submit(SubmitJob("j1", copy_job(1), "blob", "mod", "client-inbox"), splits, "file:///s")
    facts = list(core.decide(live, submitted, 1_000).facts)
    facts += core.decide(live, core.Schedule("j1", {"tm-1": [0]}, {"tm-1": "s1"}), 1_000).facts
    state = JobsState()
    for fact in facts:
        evolve(state, Envelope(fact, "f", epoch, 1_000))
    return state


def members(*facts: tuple[int, object]) -> Membership:
    m = Membership()
    for epoch, fact in facts:
        members_evolve(m, Envelope(fact, "f", epoch, 1_000))
    return m


def orphans(state: JobsState, m: Membership) -> list:
    active = {r.resource_id: r.session for r in m.active()}
    registered = {r.resource_id: r.epoch for r in m.active()}
    reasons = {rid: r.reason or "" for rid, r in m.taskmanagers.items()}
    return [f for d in core.decide(state, core.Orphans(active, reasons, CFG, registered), 2_000).jobs for f in d.facts]


REGISTERED = TaskManagerRegistered("tm-1", "s1", "host-a", 1, {})
LOST = TaskManagerLost("tm-1", "s1", "no heartbeat for 6000 ms (timeout 5000 ms)")


def test_a_registration_records_the_epoch_that_made_it_and_an_attempt_its_placements() -> None:
    m = members((1, REGISTERED), (3, LOST), (4, REGISTERED))
    assert m.taskmanagers["tm-1"].epoch == 4 and m.is_registered("tm-1", "s1")
    (ex,) = placed_at(3).jobs["j1"].executions()
    assert ex.placed_epoch == 3 and ex.session == "s1" and ex.state == TaskState.DEPLOYING


@given(registered=st.integers(1, 5), placed=st.integers(1, 9), back=st.integers(0, 4))
def test_an_attempt_placed_before_its_taskmanagers_current_registration_fails(
    registered: int, placed: int, back: int
) -> None:
    """tm-1 registered at ``registered``; the attempt placed at ``placed`` (not before the
    first registration); with ``back`` > 0, tm-1 was lost and registered again under the
    same session ``back`` epochs after the placement. The attempt fails iff its
    registration was ended by a loss, i.e. iff it was placed before the current one began."""
    placed = max(placed, registered)
    history: list[tuple[int, object]] = [(registered, REGISTERED)]
    if back:
        history += [(placed, LOST), (placed + back, REGISTERED)]
    failed = [f for f in orphans(placed_at(placed), members(*history)) if getattr(f, "state", None) == TaskState.FAILED]
    assert bool(failed) == bool(back)
    if back:
        assert "was lost (it registered again at epoch" in (failed[0].error or "")


def test_without_known_epochs_nothing_changes() -> None:
    """Attempts from a snapshot that did not keep the placement's epoch, and rows from one
    that did not keep the registration's, are judged by the session alone, as before."""
    state = placed_at(2)
    for ex in state.jobs["j1"].executions():
        ex.placed_epoch = None
    assert orphans(state, members((1, REGISTERED), (3, LOST), (4, REGISTERED))) == []
    assert orphans(placed_at(2), members((0, REGISTERED))) == []


def test_a_job_snapshot_keeps_the_placements_epoch() -> None:
    state = placed_at(7)
    snap = decode_job(encode_job(job_snapshot(state, "j1", {}, {})), job_id="j1")
    restored = JobsState()
    install_job(restored, snap)
    assert [ex.placed_epoch for ex in restored.jobs["j1"].executions()] == [7]
