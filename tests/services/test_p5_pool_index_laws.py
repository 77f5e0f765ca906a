"""The slot pool's index of what each job holds answers as the scans of every holder it
replaced (``job_snapshot``'s pool, the archiving's "does an ended job still hold slots"),
after any sequence of takes and give-backs, repeated or out of order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.services.jobmanager.snapshot import _holds_slots
from sluice.services.jobmanager.snapshot_codec import job_snapshot
from sluice.services.jobs.state import JobsState, SlotPool

TMS = ["tm-a", "tm-b"]
JOBS = ["j", "k", "l"]


def _old_held_by(pool: SlotPool, job_id: str) -> list[tuple[str, int, str]]:
    return sorted((tm, slot, eid) for (tm, slot), held in pool.used.items() for j, eid in held if j == job_id)


def _old_holds(pool: SlotPool, job_id: str) -> bool:
    return any(j == job_id for held in pool.used.values() for j, _ in held)


@settings(max_examples=300, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.booleans(),
            st.sampled_from(TMS),
            st.integers(0, 2),
            st.sampled_from(JOBS),
            st.sampled_from(["v:0:0", "v:0:1", "v:1:0", "w:0:0"]),
        ),
        max_size=50,
    )
)
def test_the_pools_index_by_job_answers_as_the_scans(ops) -> None:
    state = JobsState()
    pool = state.pool
    for take, tm, slot, job, eid in ops:
        if take:
            pool.take(tm, slot, job, eid)
        else:
            pool.give_back(tm, slot, job, eid)
        for j in JOBS:
            assert pool.held_by(j) == _old_held_by(pool, j)
            assert pool.holds(j) == _old_holds(pool, j) == _holds_slots(state, j)
            assert job_snapshot(state, j).pool == _old_held_by(pool, j)
        assert set(pool.by_job) == {j for held in pool.used.values() for j, _ in held}  # no empty entries kept
