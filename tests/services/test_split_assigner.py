"""The split assignment core (``SplitAssigner``), pure and fast: no Redis, no threads.

Modeled on what Flink's split assigner and SourceCoordinator tests check:

* the order a request is answered in: a split preferring the requester's host, else a
  split given back by a failed subtask, else the next fresh split in plan order, else None;
* dynamic load balancing: readers that ask when they are done get work in proportion to
  their speed (a discrete-event simulation, no sleeping);
* a failed subtask's splits go back to the pool, first in line; a finished subtask's are
  done for good;
* properties over random operation sequences: no split lost or duplicated, and
  ``restore(snapshot())`` continues exactly like the live assigner.
"""

from __future__ import annotations

import heapq

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sluice.services.coordination.assigner import SplitAssigner, ranges, unranges


def roundtrip(snapshot: dict) -> dict:
    """A snapshot as a new leader reads it back from the log (through JSON)."""
    return orjson.loads(orjson.dumps(snapshot))


# --- the order of answers ------------------------------------------------------------------


def test_a_split_preferring_the_requesters_host_is_given_first() -> None:
    a = SplitAssigner([("h1",), ("h2",), ("h1", "h3"), ("h2",), ()])
    assert a.next(0, "h2") == 1
    assert a.next(1, "h2") == 3
    assert a.next(2, "h3") == 2
    # h2 has nothing local left: plan order (0, then 4; 1..3 are taken)
    assert a.next(0, "h2") == 0
    assert a.next(0, "h1") == 4  # h1's splits (0, 2) are gone: plan order again
    assert a.next(1, "h1") is None
    assert a.next(1, "") is None
    assert a.remaining == 0


def test_without_locality_splits_go_in_plan_order_then_none() -> None:
    a = SplitAssigner(4)
    assert [a.next(s % 2) for s in range(4)] == [0, 1, 2, 3]
    assert a.next(0) is None and a.next(1, "anyhost") is None
    assert a.held == {0: [0, 2], 1: [1, 3]}
    assert a.remaining == 0 and a.pool() == []


def test_an_unknown_host_gets_plan_order() -> None:
    a = SplitAssigner([("h1",), ("h1",), ("h2",)])
    assert a.next(0, "elsewhere") == 0
    assert a.next(0, "h2") == 2
    assert a.next(0, "h2") == 1


def test_empty_plan_answers_none() -> None:
    a = SplitAssigner(0)
    assert a.next(0) is None and a.next(0, "h") is None
    assert a.give_back(0) == [] and a.finish(0) == []
    assert SplitAssigner.restore(0, roundtrip(a.snapshot())) == a


# --- dynamic load balancing -------------------------------------------------------------------


def simulate(a: SplitAssigner, durations: list[float]) -> tuple[list[int], float]:
    """Readers ask for a split whenever they are free; reader r takes ``durations[r]``
    per split. Returns the splits each one processed and the makespan."""
    counts = [0] * len(durations)
    heap: list[tuple[float, int]] = [(0.0, r) for r in range(len(durations))]
    heapq.heapify(heap)
    makespan = 0.0
    while heap:
        t, r = heapq.heappop(heap)
        makespan = max(makespan, t)
        split = a.next(r)
        if split is None:
            assert a.finish(r) is not None  # the reader ends: its output is committed
            continue
        counts[r] += 1
        heapq.heappush(heap, (t + durations[r], r))
    return counts, makespan


@pytest.mark.parametrize("n", [200, 1000, 37])
def test_a_slow_reader_gets_fewer_splits_and_the_makespan_is_near_ideal(n: int) -> None:
    durations = [1.0, 1.0, 5.0, 1.0]  # reader 2 is five times slower
    a = SplitAssigner(n)
    counts, makespan = simulate(a, durations)
    assert sum(counts) == n and a.done == n and a.remaining == 0 and a.held == {}
    fast = [counts[r] for r in (0, 1, 3)]
    slow = counts[2]
    assert max(fast) - min(fast) <= 1  # equal readers share equally
    for f in fast:
        assert abs(slow - f / 5) <= 1.2, counts  # ~1/5 of a fast reader's count
    ideal = n / sum(1 / d for d in durations)  # total work / total speed
    assert makespan <= ideal + max(durations), (makespan, ideal)


# --- failures and finishing --------------------------------------------------------------------


def test_give_back_puts_a_failed_subtasks_splits_first_in_line() -> None:
    a = SplitAssigner(6)
    assert [a.next(0), a.next(0), a.next(1)] == [0, 1, 2]
    assert a.give_back(0) == [0, 1]
    assert a.held == {1: [2]}
    assert a.pool() == [0, 1, 3, 4, 5]
    assert a.remaining == 5
    # the new attempt (or anyone) gets them back first, in the order they were held
    assert a.next(0) == 0
    assert a.next(2) == 1
    assert a.next(2) == 3


def test_given_back_splits_of_several_failures_keep_their_order() -> None:
    a = SplitAssigner(8)
    for s in (0, 1, 0, 1, 2):
        a.next(s)  # 0:[0,2] 1:[1,3] 2:[4]
    assert a.give_back(1) == [1, 3]
    assert a.give_back(0) == [0, 2]  # the later failure goes before the earlier one
    assert a.pool() == [0, 2, 1, 3, 5, 6, 7]
    assert [a.next(3) for _ in range(7)] == [0, 2, 1, 3, 5, 6, 7]
    assert a.next(3) is None


def test_locality_comes_before_given_back_splits() -> None:
    a = SplitAssigner([(), ("h1",), (), ("h1",)])
    assert a.next(0) == 0
    a.give_back(0)
    assert a.next(1, "h1") == 1  # local beats given back
    assert a.next(1, "h2") == 0  # given back beats plan order
    assert a.next(1, "h2") == 2
    assert a.next(1, "h1") == 3


def test_a_given_back_split_is_local_again_for_its_host() -> None:
    a = SplitAssigner([("h1",), ("h2",), ("h1",)])
    assert a.next(0, "h1") == 0
    a.give_back(0)
    assert a.next(1, "h1") == 0
    assert a.next(1, "h1") == 2
    assert a.next(1, "h1") == 1


def test_finish_marks_splits_done_and_they_are_never_handed_out_again() -> None:
    a = SplitAssigner(4)
    assert [a.next(0), a.next(1), a.next(0)] == [0, 1, 2]
    assert a.finish(0) == [0, 2]
    assert a.done == 2 and a.held == {1: [1]}
    assert a.give_back(0) == []  # finished: nothing to give back
    assert a.give_back(1) == [1]
    assert [a.next(2), a.next(2), a.next(2)] == [1, 3, None]
    assert a.finish(2) == [1, 3]
    assert a.done == 4 and a.remaining == 0 and a.pool() == []


def test_a_subtask_that_fails_twice_gives_back_only_what_its_last_attempt_held() -> None:
    a = SplitAssigner(5)
    assert a.next(0) == 0
    assert a.give_back(0) == [0]
    assert a.next(0) == 0 and a.next(0) == 1
    assert a.give_back(0) == [0, 1]
    assert a.give_back(0) == []
    assert a.pool() == [0, 1, 2, 3, 4]


# --- snapshots ---------------------------------------------------------------------------------


def test_ranges_and_unranges() -> None:
    assert ranges([1, 2, 3, 7]) == [[1, 4], [7, 8]]
    assert ranges([7, 3, 1, 2]) == [[1, 4], [7, 8]]
    assert ranges([]) == []
    assert unranges([[1, 4], [7, 8]]) == [1, 2, 3, 7]


def test_an_orderly_snapshot_is_small() -> None:
    a = SplitAssigner(100_000)
    for i in range(50_000):
        a.next(i // 12_500)  # each subtask takes a run of splits
    a.finish(0)
    snap = a.snapshot()
    assert len(orjson.dumps(snap)) < 2000  # ranges, not 50,000 indices
    assert SplitAssigner.restore(100_000, roundtrip(snap)) == a


def test_restore_refuses_a_snapshot_of_another_plan() -> None:
    snap = SplitAssigner(3).snapshot()
    with pytest.raises(ValueError, match="3 splits but the plan has 4"):
        SplitAssigner.restore(4, snap)


def test_restore_keeps_given_back_splits_first_in_line_and_held_order() -> None:
    hosts = [("h1",), (), ("h1",), (), ("h2",)]
    a = SplitAssigner(hosts)
    assert a.next(0) == 0  # not via locality
    assert a.next(1, "h2") == 4
    assert a.next(1) == 1
    a.give_back(0)
    assert a.next(2, "") == 0
    assert a.next(2, "h1") == 2
    b = SplitAssigner.restore(hosts, roundtrip(a.snapshot()))
    assert b == a and b.held == a.held == {1: [4, 1], 2: [0, 2]}
    assert b.give_back(1) == a.give_back(1) == [4, 1]
    for host in ("h2", "h1", "", "", ""):
        assert b.next(3, host) == a.next(3, host)


# --- properties over random operation sequences --------------------------------------------------

SUBTASKS = 3
HOSTS = ["", "h0", "h1"]
"""Hosts a request comes from ('': unknown); few of them, so that locality matters often."""

plans = st.lists(st.lists(st.sampled_from(HOSTS[1:]), max_size=2, unique=True).map(tuple), max_size=12)
"""Per split, its preferred hosts."""
nexts = st.tuples(st.just("next"), st.integers(0, SUBTASKS - 1), st.sampled_from(HOSTS))
operations = st.lists(
    st.one_of(
        nexts,
        nexts,  # asking is the most common operation
        st.tuples(st.just("give_back"), st.integers(0, SUBTASKS - 1)),
        st.tuples(st.just("finish"), st.integers(0, SUBTASKS - 1)),
    ),
    max_size=50,
)


class Model:
    """What every subtask holds and what was processed, checked against the assigner
    after each operation."""

    def __init__(self, hosts: list[tuple[str, ...]]) -> None:
        self.hosts = hosts
        self.held: dict[int, list[int]] = {}
        self.processed: list[int] = []  # splits of finished attempts, with repeats if any

    def apply(self, a: SplitAssigner, op: tuple) -> object:
        kind, subtask = op[0], op[1]
        if kind == "next":
            host = op[2]
            free = [i for i in range(len(self.hosts)) if i not in self.taken()]
            pool = a.pool()
            assert sorted(pool) == free
            got = a.next(subtask, host)
            if not free:
                assert got is None
                return got
            assert got in free
            local = [i for i in free if host and host in self.hosts[i]]
            if local:
                assert host in self.hosts[got]  # locality first
            else:
                assert got == pool[0]  # given back first, then plan order
            self.held.setdefault(subtask, []).append(got)
            return got
        if kind == "give_back":
            back = a.give_back(subtask)
            assert back == self.held.pop(subtask, [])
            return back
        done = a.finish(subtask)
        assert done == self.held.pop(subtask, [])
        self.processed += done
        return done

    def taken(self) -> set[int]:
        return set(self.processed) | {i for v in self.held.values() for i in v}

    def check(self, a: SplitAssigner) -> None:
        assert {s: v for s, v in a.held.items()} == self.held
        assert a.done == len(self.processed)
        assert a.remaining == len(self.hosts) - len(self.taken())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans, operations, st.lists(st.tuples(st.integers(0, SUBTASKS - 1), st.sampled_from(HOSTS)), max_size=30))
def test_every_split_is_processed_exactly_once_in_the_end(hosts, ops, drain_order) -> None:
    a = SplitAssigner(hosts)
    m = Model(hosts)
    for op in ops:
        m.apply(a, op)
        m.check(a)
    # the end: subtasks keep asking (in a random order, then round robin) until nothing is
    # left, then every one finishes
    asks = list(drain_order) + [(s, HOSTS[s % len(HOSTS)]) for s in range(SUBTASKS)] * (len(hosts) + 1)
    for subtask, host in asks:
        m.apply(a, ("next", subtask, host))
    assert a.remaining == 0 and a.next(0) is None
    for s in range(SUBTASKS):
        m.apply(a, ("finish", s))
        m.check(a)
    assert sorted(m.processed) == list(range(len(hosts)))  # none lost, none twice
    assert a.done == len(hosts) and a.held == {}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans, operations, st.integers(1, 4), st.booleans())
# a split given back is first in line for its hosts too, also after a restore
@example([("h0",), ("h1", "h0")], [("next", 0, "h1"), ("give_back", 0), ("next", 1, "h0")], 1, False)
@example([("h0",), ("h0",), ("h0",)], [("next", 0, ""), ("next", 1, ""), ("give_back", 0), ("give_back", 1)], 2, False)
def test_restore_of_a_snapshot_continues_like_the_live_assigner(hosts, ops, every, by_count) -> None:
    """Every few operations a new leader restores the live assigner's snapshot (through
    JSON); from then on it must answer every operation exactly like the live one."""
    plan = len(hosts) if by_count and not any(hosts) else hosts
    a = SplitAssigner(hosts)
    restored: list[SplitAssigner] = []
    tail = [("next", s % SUBTASKS, HOSTS[s % len(HOSTS)]) for s in range(len(hosts) + 1)]
    for step, op in enumerate(ops + tail):
        if step % every == 0:
            b = SplitAssigner.restore(plan, roundtrip(a.snapshot()))
            assert b == a
            assert b.held == a.held and b.done == a.done and b.remaining == a.remaining
            restored.append(b)
            if len(restored) > 1:  # a restore of a restore is the same again
                restored.append(SplitAssigner.restore(plan, roundtrip(restored[-2].snapshot())))
        want = getattr(a, op[0])(*op[1:])
        for b in restored:
            assert getattr(b, op[0])(*op[1:]) == want, (step, op)
            assert b.pool() == a.pool()
    for b in restored:
        assert b.snapshot() == a.snapshot()


# --- a fair share kept for readers that have not asked yet ----------------------------------


def test_a_reader_that_asks_first_leaves_the_late_readers_their_share() -> None:
    """A whole read takes its splits in one go: without a share kept for the reader that
    starts a moment later, the first one took both splits of a word count and the other
    sat idle (the job took twice as long)."""
    a = SplitAssigner(2, readers=2)
    assert a.next(1) == 0 and a.next(1) is None  # the other one's share is kept
    assert a.next(0) == 1 and a.next(0) is None
    b = SplitAssigner(2)  # without ``readers``: first come, first served
    assert b.next(1) == 0 and b.next(1) == 1


def test_once_every_reader_has_asked_they_race_for_the_rest() -> None:
    a = SplitAssigner(10, readers=2)
    taken = [a.next(1) for _ in range(6)]
    assert taken == [0, 1, 2, 3, 4, None]  # five kept for reader 0
    assert a.next(0) == 5
    assert a.next(1) == 6 and a.next(1) == 7  # reader 0 arrived: no share is kept any more


def test_a_failed_reader_gets_its_share_kept_again_for_its_next_attempt() -> None:
    a = SplitAssigner(4, readers=2)
    assert [a.next(0), a.next(0)] == [0, 1] and a.next(0) is None
    assert [a.next(1), a.next(1)] == [2, 3]
    a.give_back(1)  # reader 1 failed: its two splits are back, kept for its next attempt
    assert a.next(0) is None
    assert [a.next(1), a.next(1), a.next(1)] == [2, 3, None]


def test_fewer_splits_than_readers_are_not_kept_back() -> None:
    a = SplitAssigner(1, readers=3)  # floor(1 / 3) = 0 each: the first reader takes it
    assert a.next(2) == 0


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 40), st.integers(1, 6), st.lists(st.integers(0, 5), max_size=200), st.randoms())
def test_with_readers_every_split_is_handed_out_once_and_none_is_left_for_nobody(
    n: int, readers: int, asks: list[int], rnd
) -> None:
    """Readers ask in any order, some fail; once each reader's last attempt has asked until
    it got None, every split is held or done exactly once, and the snapshot round-trips."""
    a = SplitAssigner(n, readers=readers)
    for r in asks:
        r %= readers
        if rnd.random() < 0.1:
            a.give_back(r)
        else:
            a.next(r)
        assert a == SplitAssigner.restore(n, roundtrip(a.snapshot()), readers)
    for r in range(readers):  # every reader asks until told there is none
        while a.next(r) is not None:
            pass
    held = [i for v in a.held.values() for i in v]
    assert sorted(held) == list(range(n)) and a.remaining == 0


def test_nothing_is_kept_for_a_reader_that_finished_or_for_readers_an_old_checkpoint_does_not_name() -> None:
    """A share kept for a reader that will never ask again would never be taken: the job
    would wait for ever. A finished reader is done asking; a checkpoint written before
    shares were kept does not say who asked, so none is kept after restoring it."""
    a = SplitAssigner(4, readers=2)
    a.finish(1)  # finished (it took nothing: the other reader had taken everything, say)
    assert [a.next(0) for _ in range(5)] == [0, 1, 2, 3, None]
    old = SplitAssigner(4, readers=2).snapshot()
    del old["arrived"]
    b = SplitAssigner.restore(4, roundtrip(old), readers=2)
    assert [b.next(0) for _ in range(5)] == [0, 1, 2, 3, None]


# --- the end game: a reader is not given a split the others would finish sooner ---------------


def timed(a: SplitAssigner, paces: list, *, timed: bool = True) -> tuple[list[int], int]:
    """Readers ask whenever they are free, saying when (integer ms); reader r's k-th split
    takes ``paces[r]`` ms (or ``paces[r](k)``). Returns the splits each processed and when
    reading ended. Checks, at every "no more" while splits are left, that a reader still
    asking will take them (or a late reader's share is kept for it)."""
    counts = [0] * len(paces)
    heap = [(0, r) for r in range(len(paces))]
    heapq.heapify(heap)
    end = 0
    while heap:
        t, r = heapq.heappop(heap)
        end = max(end, t)
        split = a.next(r, now=t if timed else None)
        if split is None:
            if a.remaining:
                late = a.readers is not None and len(a.arrived) < a.readers
                assert late or any(o != r for o in a.asked), "splits left and no reader to take them"
            a.finish(r)
            continue
        pace = paces[r](counts[r]) if callable(paces[r]) else paces[r]
        counts[r] += 1
        heapq.heappush(heap, (t + pace, r))
    assert a.done == a.n and a.remaining == 0 and a.held == {}
    return counts, end


def test_a_slow_reader_is_not_given_a_last_split_the_fast_one_finishes_sooner() -> None:
    """The balance bench's case: 16 splits, a reader 5.5 s a split and one 1.3 s, whose first
    split took 2.5 s (its Spark session's Python workers starting). Without the end game the
    slow reader asks for a fourth split with three left and the read waits for it: 22 s
    against an ideal of 16.9 s; with it, 18.1 s."""
    fast = [2500] + [1300] * 20
    without, end_without = timed(SplitAssigner(16, readers=2), [fast.__getitem__, 5500], timed=False)
    withit, end_with = timed(SplitAssigner(16, readers=2), [fast.__getitem__, 5500])
    assert (without, end_without) == ([12, 4], 22000)
    assert (withit, end_with) == ([13, 3], 18100)


def test_the_end_game_needs_a_pace_and_another_reader_still_asking() -> None:
    a = SplitAssigner(3, readers=2)
    assert a.next(1, now=0) == 0  # slow: no pace yet, never held back
    assert a.next(0, now=0) == 1
    assert a.next(0, now=10) == 2  # fast: 10 ms a split
    assert a.next(1, now=5000) is None  # nothing left anyway
    b = SplitAssigner(4, readers=2)
    assert [b.next(1, now=0), b.next(0, now=0), b.next(0, now=10)] == [0, 1, 2]
    assert b.next(1, now=20) is None  # pace 20: reader 0 (10 a split, free at 20) ends split 3 at 30, not 40
    assert 1 not in b.asked and b.remaining == 1
    assert b.next(0, now=20) == 3
    c = SplitAssigner(4, readers=2)
    assert [c.next(1, now=0), c.next(0, now=0), c.next(0, now=10)] == [0, 1, 2]
    c.give_back(0)  # the fast reader failed: its next attempt has no pace, nobody is held back for it
    assert c.next(1, now=20) == 1
    d = SplitAssigner(4, readers=2)
    assert [d.next(1, now=0), d.next(0, now=0), d.next(0, now=10)] == [0, 1, 2]
    assert d.next(0) == 3  # a request that does not say when: no end game, and no pace
    assert d.pace == {0: 10}


def test_a_reader_silent_for_longer_than_its_pace_is_not_counted_on() -> None:
    """Reader 0 took 10 ms a split but has not asked for 4.99 s (a hung Spark job, a paused
    TaskManager): it is not counted on, so the slow reader is not held back for it; late
    by less than its pace again, it still is."""
    a = SplitAssigner(4, readers=2)
    assert [a.next(1, now=0), a.next(0, now=0), a.next(0, now=10)] == [0, 1, 2]
    assert a.next(1, now=5000) == 3
    b = SplitAssigner(4, readers=2)
    assert [b.next(1, now=0), b.next(0, now=0), b.next(0, now=10)] == [0, 1, 2]
    assert b.next(1, now=30) is None  # reader 0 is 10 ms late: it still ends split 3 at 40, before 60


def test_a_request_timed_before_the_readers_last_leaves_its_pace_unknown() -> None:
    """Another leader's clock, behind the last one's: an interval of 0 or less is no pace
    (a pace of 1 ms would have every other reader held back for it)."""
    a = SplitAssigner(40, readers=3)
    for r in range(3):
        a.next(r, now=10_000)
    a.next(0, now=8_000)
    assert 0 not in a.pace
    assert a.next(1, now=11_000) is not None and a.next(2, now=11_000) is not None
    a.next(0, now=8_001)  # its pace counts from the new clock on
    assert a.pace[0] == 1


def test_without_times_nothing_changes() -> None:
    """Requests recorded before Sluice kept their time, or a source not read each split."""
    durations = [1.0, 1.0, 5.0, 1.0]
    assert simulate(SplitAssigner(37), durations) == simulate(SplitAssigner(37), durations)
    a = SplitAssigner(16, readers=2)
    a.next(0), a.next(0), a.next(1)
    assert a.asked == {} and a.pace == {} and "asked" not in a.snapshot()


@settings(max_examples=400, deadline=None)
@given(st.integers(1, 60), st.lists(st.integers(1, 1000), min_size=1, max_size=5), st.booleans())
@example(16, [1300, 5500], True)
def test_with_steady_paces_the_end_game_never_makes_reading_longer(n: int, paces: list[int], share: bool) -> None:
    """Each reader takes the same time for every split: the end game knows each pace after
    its first split. It may only shorten the read, and every split is read once."""
    readers = len(paces) if share else None
    plain, end_plain = timed(SplitAssigner(n, readers), paces, timed=False)
    counts, end = timed(SplitAssigner(n, readers), paces)
    assert sum(counts) == sum(plain) == n
    assert end <= end_plain, (counts, plain)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 40),
    st.integers(1, 5),
    st.lists(
        st.tuples(st.integers(0, 4), st.integers(0, 3000), st.sampled_from(["next", "next", "next", "fail"])),
        max_size=120,
    ),
    st.integers(1, 6),
)
def test_timed_requests_leave_no_split_unread_and_restore_continues_alike(n, readers, ops, every) -> None:
    """Readers ask at any time in any order and fail now and then. Every few operations a
    new leader restores the snapshot (through JSON) and must answer alike; in the end every
    reader asks until told "no more" and then every split is held once."""
    a = SplitAssigner(n, readers=readers)
    now = 0
    restored: list[SplitAssigner] = []
    for step, (r, dt, kind) in enumerate(ops):
        r %= readers
        now += dt
        if step % every == 0:
            restored.append(SplitAssigner.restore(n, roundtrip(a.snapshot()), readers))
        if kind == "fail":
            want = a.give_back(r)
            assert all(b.give_back(r) == want for b in restored)
        else:
            want = a.next(r, now=now)
            assert all(b.next(r, now=now) == want for b in restored), step
        assert all(b == a for b in restored)
    for r in range(readers):  # every reader's attempt asks until told there is none
        while a.next(r, now=now) is not None:
            now += 1
    held = [i for v in a.held.values() for i in v]
    assert sorted(held) == list(range(n)) and a.remaining == 0


def test_the_end_game_is_not_played_among_many_readers() -> None:
    from sluice.services.coordination.assigner import END_GAME_READERS

    many = END_GAME_READERS + 1
    a = SplitAssigner(many * 2 + 1)
    for r in range(many):
        a.next(r, now=0)
    for r in range(many):
        a.next(r, now=10)
    assert a.next(0, now=10_000) is not None  # slower than all the rest, but not held back


# --- a share kept only for a reader that holds a slot ----------------------------------------


def test_a_reader_waiting_for_a_slot_keeps_no_share_and_the_running_ones_read_everything() -> None:
    """Issue 31: 4 readers on 2 slots. Readers 2 and 3 wait for a slot until 0 and 1 finish;
    a share kept for them made 0 and 1 stop early and the read wait for 2 and 3's turn."""
    a = SplitAssigner(8, readers=4, scheduled=True)
    a.schedule(0)
    a.schedule(1)
    assert [a.next(0) for _ in range(3)] == [0, 1, 2]  # 1's share (2 splits) is kept: it holds a slot
    assert a.next(0) == 3  # not 2's nor 3's: they hold none
    assert [a.next(1) for _ in range(5)] == [4, 5, 6, 7, None]
    assert a.next(0) is None
    a.finish(0)
    a.finish(1)
    a.schedule(2)
    a.schedule(3)
    assert a.next(2) is None and a.next(3) is None  # scheduled at last: nothing left, they finish at once


def test_a_scheduled_reader_keeps_its_share_until_it_fails_and_an_old_checkpoint_counts_every_reader() -> None:
    a = SplitAssigner(4, readers=2, scheduled=True)
    a.schedule(1)
    assert [a.next(0) for _ in range(3)] == [0, 1, None]  # 1's share kept
    a.give_back(1)  # its attempt failed before asking: the next one waits for a slot again
    assert [a.next(0) for _ in range(3)] == [2, 3, None]
    assert SplitAssigner.restore(4, roundtrip(a.snapshot()), 2, scheduled=True) == a
    old = SplitAssigner(4, readers=2).snapshot()  # no "scheduled": every reader is counted, as before
    b = SplitAssigner.restore(4, roundtrip(old), readers=2, scheduled=True)
    assert [b.next(0) for _ in range(3)] == [0, 1, None]
