"""The publishing protocol of sink attempts, over names only: no Spark, no files.

A small simulator runs several attempts of one sink subtask over an in-memory directory
(a set of names). Every listing, move and delete is one operation, and the test picks
which attempt takes the next operation: every interleaving is a possible run of
attempts on different hosts over one shared file system.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.services.dataplane import DataplaneError
from sluice.services.dataplane.publish import (
    LEGACY_ATTEMPT,
    Action,
    Outcome,
    Publication,
    Step,
    current,
    is_marker,
    marker_name,
    names,
    parse,
    part_name,
    plan,
    staging_name,
    superseded,
)

S = 3  # the subtask whose attempts race
FOREIGN = frozenset(
    {
        "_SUCCESS",
        "README.md",
        ".hidden",
        staging_name(S, 7),
        "part-00003-x.csv",
        "part-3-000.csv",
        *names(2, 0, ["csv"]),
        *names(4, 9, ["csv", "csv"]),
        "part-00002-000.csv",
        part_name(4, 10, 0, "csv"),
    }
)
"""Names that are not attempt ``S``'s: other subtasks' files, published or not, and names not ours."""


# --- names ---------------------------------------------------------------------------------------------------


def test_names_round_trip_and_sort() -> None:
    assert part_name(3, 1, 0, "snappy.parquet") == "part-00003-a000001-000.snappy.parquet"
    assert marker_name(3, 1) == "_part-00003-a000001.published"
    assert staging_name(3, 1) == "_attempt-00003-a000001"
    assert names(3, 1, ["csv", "csv"]) == (
        "part-00003-a000001-000.csv",
        "part-00003-a000001-001.csv",
        "_part-00003-a000001.published",
    )
    assert parse("part-00003-a000001-000.snappy.parquet") == (3, 1)
    assert parse("_part-00003-a000001.published") == (3, 1) and is_marker("_part-00003-a000001.published")
    assert parse("part-00003-000.parquet") == (3, LEGACY_ATTEMPT) and not is_marker("part-00003-000.parquet")
    assert parse(part_name(123456, 1234567, 1000, "csv.gz")) == (123456, 1234567)
    for other in (
        "_SUCCESS",
        "part-00000-1b2c3d4e-5f60-c000.snappy.parquet",
        "part-00003-a000001-000",
        "_part-00003-000.published",
        "x/part-00003-a000001-000.csv",
        ".part-00003-a000001-000.csv.crc",
    ):
        assert parse(other) is None, other
    ordered = [
        part_name(0, 0, 0, "csv"),
        part_name(0, 0, 1, "csv"),
        part_name(0, 1, 0, "csv"),
        part_name(1, 0, 0, "csv"),
    ]
    assert sorted(ordered) == ordered
    assert min("part-00000-a000000-000.csv", "part-00000-000.csv") == "part-00000-000.csv"  # legacy sorts first


@pytest.mark.parametrize("bad", [-1, True, 1.0, "1", None])
def test_subtask_and_attempt_are_ints_at_least_zero(bad) -> None:
    with pytest.raises(DataplaneError, match="attempt must be an int >= 0"):
        plan([], 0, bad)
    with pytest.raises(DataplaneError, match="subtask must be an int >= 0"):
        part_name(bad, 0, 0, "csv")


# --- one listing -------------------------------------------------------------------------------------------


def test_plan_reads_only_its_subtask() -> None:
    listing = [
        *FOREIGN,
        "part-00003-000.csv",
        *names(S, 0, ["csv"]),
        part_name(S, 1, 0, "csv"),
        *names(S, 2, ["csv"]),
        part_name(S, 5, 0, "csv"),
    ]  # 1 and 5: partial, unpublished
    p = plan(listing, S, 2)
    assert p.newest == 2 and not p.discard
    assert p.delete == (marker_name(S, 0), "part-00003-000.csv", part_name(S, 0, 0, "csv"), part_name(S, 1, 0, "csv"))
    assert plan(listing, S, 1).discard  # attempt 2 published
    assert not plan(listing, S, 3).discard  # attempt 5 did not (yet): no marker
    assert plan([*FOREIGN], S, 0) == plan([], S, 0)


def test_current_takes_the_newest_published_attempt_of_each_subtask() -> None:
    listing = [
        "part-00000-000.csv",
        "part-00001-000.csv",
        *names(1, 0, ["csv"]),
        *names(1, 2, ["csv", "csv"]),
        part_name(1, 3, 0, "csv"),
        "_SUCCESS",
    ]
    assert current(listing) == ("part-00000-000.csv", part_name(1, 2, 0, "csv"), part_name(1, 2, 1, "csv"))
    assert current([]) == ()


def test_the_steps_in_order() -> None:
    pub = Publication.start(S, 1, ["csv"])
    assert pub.step is Step.CHECK and pub.needs_listing
    pub, action = pub.advance(["part-00003-000.csv", *FOREIGN])
    assert pub.step is Step.MOVE and action == Action() and not pub.needs_listing
    pub, action = pub.advance()
    assert action == Action(move=(part_name(S, 1, 0, "csv"), marker_name(S, 1)))  # the marker last
    pub, action = pub.advance(["part-00003-000.csv", *action.move, *FOREIGN])
    assert pub.step is Step.RECHECK and action == Action(delete=("part-00003-000.csv",))
    pub, action = pub.advance([*names(S, 1, ["csv"]), *FOREIGN])
    assert pub.done and pub.outcome is Outcome.PUBLISHED and action == Action()
    with pytest.raises(DataplaneError, match="has finished publishing"):
        pub.advance([])
    with pytest.raises(DataplaneError, match="needs a listing"):
        Publication.start(S, 1, []).advance()


def test_superseded_at_check_and_withdrawn_at_recheck() -> None:
    newer = names(S, 2, ["csv"])
    pub, action = Publication.start(S, 1, ["csv"]).advance(newer)
    assert pub.outcome is Outcome.SUPERSEDED and action == Action()
    pub = Publication(S, 1, names(S, 1, ["csv"]), Step.RECHECK)
    pub, action = pub.advance([*newer, *pub.names])
    assert pub.outcome is Outcome.WITHDRAWN and action == Action(delete=(marker_name(S, 1), part_name(S, 1, 0, "csv")))


# --- every interleaving ----------------------------------------------------------------------------------


@dataclass
class Runner:
    """One attempt in the simulator: its publication and the file operations it has yet to do."""

    pub: Publication
    pending: list[tuple[str, str]] = field(default_factory=list)
    crashed: bool = False

    @property
    def finished(self) -> bool:
        return self.crashed or (self.pub.done and not self.pending)

    @property
    def passed_check(self) -> bool:
        return self.pub.step not in (Step.CHECK,) and self.pub.outcome is not Outcome.SUPERSEDED


class Directory:
    """The shared sink directory: a set of names, and the attempts working on it."""

    def __init__(self, initial: set[str], attempts: dict[int, int]) -> None:
        self.files = set(initial)
        self.initial = frozenset(initial)
        self.runners = {a: Runner(Publication.start(S, a, ["csv"] * n)) for a, n in attempts.items()}
        self.ever_published: set[int] = {a for n in initial if is_marker(n) and (a := self._of_s(n)) is not None}

    @staticmethod
    @functools.cache
    def _of_s(name: str) -> int | None:
        parsed = parse(name)
        return parsed[1] if parsed is not None and parsed[0] == S else None

    def clone(self) -> Directory:
        copy = object.__new__(Directory)
        copy.files, copy.initial, copy.ever_published = set(self.files), self.initial, set(self.ever_published)
        copy.runners = {a: Runner(r.pub, list(r.pending), r.crashed) for a, r in self.runners.items()}
        return copy

    def key(self) -> tuple:
        return (
            frozenset(self.files),
            frozenset(self.ever_published),
            tuple((a, r.pub, tuple(r.pending), r.crashed) for a, r in sorted(self.runners.items())),
        )

    def runnable(self) -> list[int]:
        return [a for a, r in self.runners.items() if not r.finished]

    def tick(self, attempt: int) -> None:
        """One file operation of ``attempt``: a listing (and the decision on it), a move or a delete."""
        r = self.runners[attempt]
        if not r.pending:
            listing = sorted(self.files) if r.pub.needs_listing else None
            r.pub, action = r.pub.advance(listing)
            r.pending = [("move", n) for n in action.move] + [("delete", n) for n in action.delete]
            while not r.pub.done and not r.pub.needs_listing and not r.pending:  # a decision without I/O
                r.pub, action = r.pub.advance()
                r.pending = [("move", n) for n in action.move] + [("delete", n) for n in action.delete]
            return
        op, name = r.pending.pop(0)
        if op == "move":
            assert name not in self.files, f"{name} moved in twice"
            self.files.add(name)
            if is_marker(name):
                self.ever_published.add(attempt)
        else:
            self.files.discard(name)

    def of_s(self) -> set[str]:
        return {n for n in self.files if self._of_s(n) is not None}

    def check_readers_see_a_whole_attempt(self) -> None:
        """At any moment: the highest attempt that has ever published is all there, and
        ``current`` names exactly its data files."""
        if not self.ever_published:
            return
        k = max(self.ever_published)
        theirs = {n for n in self.of_s() if self._of_s(n) == k}
        if k in self.runners:
            assert theirs == set(self.runners[k].pub.names), (k, sorted(self.files))
        assert {n for n in current(self.files) if parse(n)[0] == S} == {n for n in theirs if not is_marker(n)}

    def check_others_untouched(self) -> None:
        assert self.files - self.of_s() == self.initial - {n for n in self.initial if self._of_s(n) is not None}


def run(directory: Directory, choose) -> None:
    while runnable := directory.runnable():
        directory.tick(choose(runnable))
        directory.check_readers_see_a_whole_attempt()
        directory.check_others_untouched()


def check_converged(directory: Directory) -> None:
    """After every attempt finished: exactly the newest published attempt's files remain for S."""
    movers = [a for a, r in directory.runners.items() if r.passed_check]
    initial_published = [a for n in directory.initial if is_marker(n) and (a := Directory._of_s(n)) is not None]
    newest = max(movers + initial_published)
    if newest in directory.runners:
        expected = set(directory.runners[newest].pub.names)
        assert directory.runners[newest].pub.outcome is Outcome.PUBLISHED
    else:
        expected = {n for n in directory.initial if Directory._of_s(n) == newest}
    assert directory.of_s() == expected, sorted(directory.files)
    directory.check_others_untouched()


def older_leftovers(first: int) -> set[str]:
    """What attempts before ``first`` may have left: legacy files, a published attempt, a partial one."""
    left = {"part-00003-000.csv", "part-00003-001.csv"}
    if first >= 2:
        left |= {*names(S, first - 2, ["csv", "csv"]), part_name(S, first - 1, 0, "csv")}
    return left


def all_schedules(directory: Directory) -> tuple[list[Directory], int]:
    """The final directories of every interleaving of the attempts' operations (each state on
    the way checked), and how many states there were. Depth-first over the choices; a state reached by two orders is explored
    once (what follows depends on the state only), so every order is covered, in far fewer steps."""
    finals, seen, todo = [], set(), [directory]
    while todo:
        d = todo.pop()
        if (key := d.key()) in seen:
            continue
        seen.add(key)
        if not (runnable := d.runnable()):
            finals.append(d)
        for a in runnable:
            nxt = d.clone()
            nxt.tick(a)
            nxt.check_readers_see_a_whole_attempt()
            nxt.check_others_untouched()
            todo.append(nxt)
    return finals, len(seen)


@pytest.mark.parametrize("counts", [(0, 0), (1, 0), (0, 1), (1, 1), (2, 1), (1, 2), (2, 2), (0, 0, 0), (1, 0, 1)])
def test_attempts_in_every_order(counts: tuple[int, ...]) -> None:
    """Attempts 0, 1 (and 2) of one subtask, ``counts[a]`` data files each, in every
    interleaving: attempt 0 is the one on a TaskManager declared lost, still running."""
    finals, states = all_schedules(Directory(set(FOREIGN) | {"part-00003-000.csv"}, dict(enumerate(counts))))
    for d in finals:
        check_converged(d)
    assert states > 30  # it did interleave


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_two_to_four_attempts_in_any_order(data: st.DataObject) -> None:
    attempts = sorted(data.draw(st.sets(st.integers(0, 12), min_size=2, max_size=4), label="attempts"))
    counts = {a: data.draw(st.integers(0, 3), label=f"data files of attempt {a}") for a in attempts}
    initial = set(FOREIGN) | older_leftovers(attempts[0])
    if data.draw(st.booleans(), label="a newer attempt already published"):
        initial = set(FOREIGN) | set(names(S, 20, ["csv"]))  # it deleted what was older
    d = Directory(initial, counts)
    run(d, lambda runnable: data.draw(st.sampled_from(runnable)))
    check_converged(d)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_attempts_that_die_midway(data: st.DataObject) -> None:
    """Processes die between any two operations. An attempt that finished leaves nothing when
    a newer one that moved files in finished too; the newest that moved, if it finished,
    leaves all its files; and readers always find a whole attempt."""
    attempts = sorted(data.draw(st.sets(st.integers(0, 12), min_size=2, max_size=4), label="attempts"))
    d = Directory(
        set(FOREIGN) | older_leftovers(attempts[0]),
        {a: data.draw(st.integers(0, 2), label=f"data files of attempt {a}") for a in attempts},
    )
    dies = data.draw(st.sets(st.sampled_from(attempts), max_size=len(attempts) - 1), label="attempts that die")

    def choose(runnable: list[int]) -> int:
        a = data.draw(st.sampled_from(runnable))
        if a in dies and data.draw(st.integers(0, 4)) == 0:
            d.runners[a].crashed = True
        return a

    while runnable := d.runnable():
        a = choose(runnable)
        if not d.runners[a].crashed:
            d.tick(a)
        d.check_readers_see_a_whole_attempt()
        d.check_others_untouched()
    movers = [a for a, r in d.runners.items() if r.passed_check]
    finished_movers = [a for a in movers if not d.runners[a].crashed]
    for a, r in d.runners.items():
        mine = {n for n in d.of_s() if Directory._of_s(n) == a}
        if a == max(movers, default=None) and not r.crashed:
            assert mine == set(r.pub.names) and r.pub.outcome is Outcome.PUBLISHED
        elif not r.crashed and any(b > a for b in finished_movers):
            assert mine == set(), (a, sorted(d.files))


def sweep(d: Directory) -> None:
    """What a TaskManager does after it killed an attempt: delete what is superseded."""
    for name in superseded(sorted(d.files), S):
        d.files.discard(name)


def test_superseded_names_the_attempts_older_than_the_newest_marker() -> None:
    files = {
        *names(S, 1, ["csv"]),
        part_name(S, 2, 0, "csv"),
        *names(S, 4, ["csv", "csv"]),
        part_name(S, 6, 0, "csv"),
        "part-00003-000.csv",
        *FOREIGN,
    }
    gone = superseded(files, S)  # older than attempt 4, the newest published: markers first
    assert gone == (marker_name(S, 1), "part-00003-000.csv", part_name(S, 1, 0, "csv"), part_name(S, 2, 0, "csv"))
    assert superseded(files, 7) == ()  # no published attempt: nothing is superseded
    assert superseded(set(FOREIGN) | {"part-00003-000.csv"}, S) == ()


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_sweeps_at_any_moment_and_after_the_dead_leave_exactly_the_newest_published_attempt(
    data: st.DataObject,
) -> None:
    """Attempts die between any two operations, and sweeps run at random moments (a
    TaskManager that killed a stale attempt). A sweep never takes a file of the newest
    published attempt (readers still find it whole), and once every attempt stopped, a sweep
    leaves exactly the newest mover's files if it finished, whichever older ones died
    halfway through publishing (they left files no step 3 or 4 would remove)."""
    attempts = sorted(data.draw(st.sets(st.integers(0, 12), min_size=2, max_size=4), label="attempts"))
    d = Directory(
        set(FOREIGN) | older_leftovers(attempts[0]),
        {a: data.draw(st.integers(0, 2), label=f"data files of attempt {a}") for a in attempts},
    )
    dies = data.draw(st.sets(st.sampled_from(attempts), max_size=len(attempts) - 1), label="attempts that die")
    while runnable := d.runnable():
        a = data.draw(st.sampled_from(runnable))
        if a in dies and data.draw(st.integers(0, 4)) == 0:
            d.runners[a].crashed = True
        if not d.runners[a].crashed:
            d.tick(a)
        if data.draw(st.integers(0, 5)) == 0:
            sweep(d)
        d.check_readers_see_a_whole_attempt()
        d.check_others_untouched()
    sweep(d)
    d.check_others_untouched()
    movers = [a for a, r in d.runners.items() if r.passed_check]
    newest = max(movers, default=None)
    if newest is not None and not d.runners[newest].crashed:
        assert d.of_s() == set(d.runners[newest].pub.names), sorted(d.files)
