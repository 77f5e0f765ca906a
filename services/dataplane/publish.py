"""Publishing a sink attempt's files so that the newest attempt of each subtask wins.

Pure: functions over file *names* (base names in the sink directory), no I/O. The
shell (``exchange.write_sink``) lists, moves and deletes with pyarrow's file systems; a
simulation runs the same functions over an in-memory set of names.

Why: a TaskManager declared lost may still run its tasks. Its attempt ``a`` of sink
subtask ``s`` and the replacement ``a + 1`` can then publish in any order, or at the same
time, from two hosts onto one shared file system, without locks. The newest attempt must
win: an older one may have read other input splits (its splits went to others when it
was failed), and must never replace newer output.

Names
-----
* data files: ``part-{s:05d}-a{a:06d}-{i:03d}.{ext}`` (``part-00003-a000001-000.parquet``);
  they sort by subtask, attempt, index, and the directory stays one flat dataset that
  Spark reads whole.
* the marker: ``_part-{s:05d}-a{a:06d}.published``, an empty file that is moved in
  *last*; it says "attempt ``a`` of ``s`` is complete in the directory". It also gives an
  attempt that wrote no data file a presence. Readers skip it (Spark, Hadoop and pyarrow
  ignore names that start with ``_`` and hold no ``=``).
* staging: ``_attempt-{s:05d}-a{a:06d}/``, private to one attempt (Spark writes there).
* files of the naming before attempts, ``part-{s:05d}-{i:03d}.{ext}``, are attempt ``-1``:
  older than any attempt, and without marker.

Anything else in the directory is not ours and is never touched.

The protocol (one attempt ``a`` of subtask ``s``; "newer" means a higher attempt of ``s``)
---------------------------------------------------------------------------------------
0. (private) Spark writes the attempt's data into its staging directory.
1. **check**: list the directory; if a newer attempt's marker is there, discard the
   staging and stop (``SUPERSEDED``): nothing of ``a`` ever becomes visible.
2. **move**: move the data files in, one by one, then the marker last.
3. **delete older**: list the directory; delete every file of an older attempt of ``s``
   (markers first): complete ones, partial ones of attempts that died, old-style ones.
4. **re-check**: list the directory; if a newer attempt's marker appeared meanwhile,
   delete ``a``'s own files (marker first) and stop (``WITHDRAWN``); else ``PUBLISHED``.

:class:`Publication` is this protocol as a state machine: ``advance(listing)`` takes a
listing when ``needs_listing`` (steps 1, 3, 4) and returns the next state and an
:class:`Action` (names to move in, in order; names to delete, in order; missing names
are fine to delete). Each listing, move and delete is a separate operation on the file
system: a simulation may interleave the operations of several attempts in any order, as
long as one attempt's own operations keep their order (moves in the order given, the
marker last).

Why the directory converges
---------------------------
Assumptions: a listing returns every file that is there for the whole time it runs (it
need not be a snapshot: files moved or deleted meanwhile may or may not show), so it sees
every move that completed before it began (local disks, HDFS, S3 and GCS; NFS only with
attribute caching off); a move is atomic; attempt numbers of a subtask are unique (every
deployment gets a new one); and an attempt moves each of its names in once.

Let ``M`` be the highest attempt of ``s`` that passed step 1. When every attempt has
finished its steps (none died or failed midway), the files of ``s`` are exactly ``M``'s:

* ``M``'s files stay. Only two steps delete them: step 3 of a newer attempt (none passed
  step 1, so none moved or deleted anything) and ``M``'s own step 4, which needs a newer
  marker (there is none, for the same reason).
* Any older attempt ``a`` that moved files in is gone. ``M``'s step-3 listing comes after
  its marker was moved in. If all of ``a``'s moves completed before that listing began,
  ``M`` deletes them. If one completed later, ``a``'s step-4 listing begins later still,
  so it sees ``M``'s marker (which stays), and ``a`` withdraws its files itself.
* Files of other subtasks, and names that don't parse, are never in a plan.

Step 1 is not needed for that argument; it keeps an attempt that starts publishing after
a newer one published from ever becoming visible.

What a reader may see
---------------------
While attempts publish, a reader that lists the directory may see, per subtask, files of
more than one attempt (the old one not yet deleted, a newer one moving in, a stale one
about to withdraw): duplicate or partial rows. It never loses a subtask once one attempt
published: the highest attempt whose marker has appeared so far keeps all its files (its
marker is moved after its data, and only a newer marker leads anyone to delete them) --
unless its own publication fails: the shell then takes its files back, its task fails,
and the restarted attempt publishes the subtask. :func:`current` names, from one
listing, exactly the files of the newest published attempt of each subtask, for a reader
that must be exact at any moment.

A job reports FINISHED only after the final attempt of every sink subtask FINISHED, and
an attempt reports FINISHED only after its publication returned: its files are in and
every older file its step-3 listing saw is gone. A reader after the job ends therefore
sees exactly one attempt per subtask, with one exception: a stale attempt on a lost
TaskManager that passed step 1 *before* the final attempt published may still be between
steps 2 and 4; its files are visible until its step 4 withdraws them a few file
operations later. If its process dies in between (its TaskManager, told it was declared
lost, kills its tasks as Flink's do), the TaskManager deletes what it left once the worker
is dead (:func:`superseded`); only a TaskManager that dies itself at that moment leaves
them, and :func:`current` reads past them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from enum import Enum

from sluice.services.dataplane.errors import DataplaneError

__all__ = [
    "LEGACY_ATTEMPT",
    "Action",
    "Outcome",
    "Plan",
    "Publication",
    "Step",
    "abandoned",
    "current",
    "superseded",
    "is_marker",
    "marker_name",
    "names",
    "parse",
    "part_name",
    "plan",
    "staging_name",
]

LEGACY_ATTEMPT = -1
"""The attempt of files named before attempts were (``part-00000-000.parquet``)."""

_PART = re.compile(r"part-(\d{5,})-(?:a(\d{6,})-)?\d{3,}\.[A-Za-z0-9.]+")
_MARKER = re.compile(r"_part-(\d{5,})-a(\d{6,})\.published")


def _check(subtask: int, attempt: int) -> None:
    for what, value in (("subtask", subtask), ("attempt", attempt)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise DataplaneError(f"{what} must be an int >= 0, got {value!r}")


def part_name(subtask: int, attempt: int, index: int, ext: str) -> str:
    """The published name of data file ``index`` of an attempt."""
    _check(subtask, attempt)
    return f"part-{subtask:05d}-a{attempt:06d}-{index:03d}.{ext}"


def marker_name(subtask: int, attempt: int) -> str:
    """The attempt's marker: moved in last, it says the attempt's files are all in."""
    _check(subtask, attempt)
    return f"_part-{subtask:05d}-a{attempt:06d}.published"


def staging_name(subtask: int, attempt: int) -> str:
    """The attempt's private staging directory (hidden from readers by its ``_``)."""
    _check(subtask, attempt)
    return f"_attempt-{subtask:05d}-a{attempt:06d}"


def names(subtask: int, attempt: int, exts: Sequence[str]) -> tuple[str, ...]:
    """Everything an attempt publishes, in the order it moves them in: its data files (one
    per extension in ``exts``, e.g. ``("snappy.parquet",)``), then its marker."""
    return (*(part_name(subtask, attempt, i, ext) for i, ext in enumerate(exts)), marker_name(subtask, attempt))


def parse(name: str) -> tuple[int, int] | None:
    """``(subtask, attempt)`` of a data file or marker name, ``LEGACY_ATTEMPT`` for old-style
    data files; ``None`` for any other name."""
    if m := _MARKER.fullmatch(name):
        return int(m[1]), int(m[2])
    if m := _PART.fullmatch(name):
        return int(m[1]), LEGACY_ATTEMPT if m[2] is None else int(m[2])
    return None


def is_marker(name: str) -> bool:
    return _MARKER.fullmatch(name) is not None


def _markers_first(found: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(found, key=lambda n: (not is_marker(n), n)))


@dataclass(frozen=True)
class Plan:
    """What one listing means to attempt ``attempt`` of ``subtask``."""

    newest: int | None
    """The highest attempt of the subtask whose marker is listed (any attempt, this one included)."""
    discard: bool
    """A newer attempt published: at step 1 publish nothing, at step 4 withdraw."""
    delete: tuple[str, ...]
    """Files of older attempts of the subtask (markers first): what step 3 deletes."""


def plan(existing: Iterable[str], subtask: int, attempt: int) -> Plan:
    """Read one listing of the sink directory (base names) for one attempt."""
    _check(subtask, attempt)
    newest: int | None = None
    older = []
    for name in existing:
        parsed = parse(name)
        if parsed is None or parsed[0] != subtask:
            continue
        if is_marker(name) and (newest is None or parsed[1] > newest):
            newest = parsed[1]
        if parsed[1] < attempt:
            older.append(name)
    return Plan(newest, newest is not None and newest > attempt, _markers_first(older))


def superseded(existing: Iterable[str], subtask: int) -> tuple[str, ...]:
    """From one listing, the files of ``subtask``'s attempts older than its newest published
    one (markers first): what that attempt's step 3 deletes. Anyone may delete them at any
    time: once a newer attempt published, an older one is never the one that counts. This
    cleans up after a stale attempt that moved files in after the newest one's step 3 and
    died before its own step 4 withdrew them."""
    listed = list(existing)
    newest = plan(listed, subtask, 0).newest
    return () if newest is None else plan(listed, subtask, newest).delete


def abandoned(existing: Iterable[str], subtask: int, attempt: int) -> tuple[str, ...]:
    """From one listing, the files of attempt ``attempt`` of ``subtask`` if it never published
    (its marker is not there): what an attempt killed halfway through its moves left, which
    no newer attempt deletes when the attempt was the newest (a speculative attempt that
    lost its race: services/jobs/speculation.py). Safe for an attempt the leader cancelled:
    it never counts. With its marker it is complete (and may be the one that counts): nothing."""
    listed = list(existing)
    if marker_name(subtask, attempt) in listed:
        return ()
    return tuple(sorted(name for name in listed if parse(name) == (subtask, attempt)))


def current(existing: Iterable[str]) -> tuple[str, ...]:
    """From one listing, the data files a reader should take: for every subtask those of its
    newest published attempt (old-style files where no attempt published), sorted."""
    listed = list(existing)
    newest: dict[int, int] = {}
    for name in listed:
        parsed = parse(name)
        if parsed is not None and is_marker(name):
            newest[parsed[0]] = max(parsed[1], newest.get(parsed[0], parsed[1]))
    return tuple(
        sorted(
            name
            for name in listed
            if (parsed := parse(name)) is not None
            and not is_marker(name)
            and parsed[1] == newest.get(parsed[0], LEGACY_ATTEMPT)
        )
    )


class Step(str, Enum):
    """Where a publication is: the protocol's steps 1-4, then done."""

    CHECK = "check"
    MOVE = "move"
    DELETE_OLDER = "delete-older"
    RECHECK = "re-check"
    DONE = "done"


class Outcome(str, Enum):
    PUBLISHED = "published"
    SUPERSEDED = "superseded"
    """A newer attempt had published before this one began: it published nothing."""
    WITHDRAWN = "withdrawn"
    """A newer attempt published while this one did: it took its files back."""


@dataclass(frozen=True)
class Action:
    """File operations to carry out, each on its own: ``move`` in the order given (the
    marker last), then ``delete`` in the order given (a name already gone is fine)."""

    move: tuple[str, ...] = ()
    delete: tuple[str, ...] = ()


_NEEDS_LISTING = frozenset({Step.CHECK, Step.DELETE_OLDER, Step.RECHECK})


@dataclass(frozen=True)
class Publication:
    """One attempt going through the protocol; ``names`` is what it publishes, marker last."""

    subtask: int
    attempt: int
    names: tuple[str, ...]
    step: Step = Step.CHECK
    outcome: Outcome | None = None

    @classmethod
    def start(cls, subtask: int, attempt: int, exts: Sequence[str]) -> Publication:
        """An attempt whose staging holds data files with extensions ``exts``, about to take step 1."""
        return cls(subtask, attempt, names(subtask, attempt, exts))

    @property
    def done(self) -> bool:
        return self.step is Step.DONE

    @property
    def needs_listing(self) -> bool:
        """Whether ``advance`` needs a listing of the directory, taken just before."""
        return self.step in _NEEDS_LISTING

    def advance(self, listing: Iterable[str] | None = None) -> tuple[Publication, Action]:
        """Take the current step: the next state, and what to do on the file system."""
        if self.step in _NEEDS_LISTING and listing is None:
            raise DataplaneError(
                f"step {self.step.value} of attempt {self.attempt} of subtask {self.subtask} "
                "needs a listing of the sink directory"
            )
        if self.step is Step.CHECK:
            if plan(listing or (), self.subtask, self.attempt).discard:
                return replace(self, step=Step.DONE, outcome=Outcome.SUPERSEDED), Action()
            return replace(self, step=Step.MOVE), Action()
        if self.step is Step.MOVE:
            return replace(self, step=Step.DELETE_OLDER), Action(move=self.names)
        if self.step is Step.DELETE_OLDER:
            return replace(self, step=Step.RECHECK), Action(
                delete=plan(listing or (), self.subtask, self.attempt).delete
            )
        if self.step is Step.RECHECK:
            if plan(listing or (), self.subtask, self.attempt).discard:
                return replace(self, step=Step.DONE, outcome=Outcome.WITHDRAWN), Action(
                    delete=_markers_first(self.names)
                )
            return replace(self, step=Step.DONE, outcome=Outcome.PUBLISHED), Action()
        raise DataplaneError(
            f"attempt {self.attempt} of subtask {self.subtask} has finished publishing "
            f"({self.outcome.value if self.outcome else 'no outcome'}): nothing to advance"
        )
