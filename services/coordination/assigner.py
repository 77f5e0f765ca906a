"""The split assignment core, pure: which split a source subtask gets next.

Shared by both split protocols (``RequestNextInputSplit`` and the enumerator's operator
events). Splits are known by their index in the job's split plan. A request gets:

1. a split whose preferred hosts include the requester's host, if one is left;
2. else a split given back by a failed subtask (they go first: they are late already);
3. else the next fresh split in plan order.

Nothing is pushed ahead of time: a subtask gets a split when it asks, so a fast subtask
takes more splits than a slow one (dynamic load balancing). Given the number of
``readers``, a reader that asks before the others have keeps its hands off their fair
share (``floor(splits / readers)`` for each reader whose current attempt has not asked
yet): a reader that takes its splits in one go (a whole read) could otherwise take them
all before the next one started, and leave it idle. This relies on what every reader does
anyway: its attempt asks until it is told there are no more (one that finished without
asking would leave its share unread; a finished reader keeps no share). Given who is
scheduled (``scheduled``, tracked by the source coordinator from the log's SCHEDULED
facts), a share is kept only for a reader whose attempt holds a slot and has not asked
yet: one that waits for a slot (more readers than slots) may start only when the running
ones finish, and a share kept for it would hold the whole read back until then (the
readers running take its splits, and it is told "no more" when it asks). The splits an attempt holds
go back to the pool when it fails, and are done when it finishes (a source task commits
its output only when it finishes, so a failed attempt processed none of them).

**The end game.** Given the time of each request (``now``: the leader's clock when it
recorded the request, from the log, so a replayed assigner decides the same), a reader's
pace is the time between its current attempt's last two requests: a reader that asks after
it processed its split (``each_split``) spends that long on a split. A reader is told "no
more" while splits are left when the other readers still asking would, at their paces,
finish every one of them before it would finish one: a slow reader taking one of the last
splits would make the whole read wait for it. A reader silent for more than twice its pace
is not counted on (it may be stuck), and a request timed before the same reader's last one
(another leader's clock) leaves its pace unknown. Only readers still asking count (not one
told "no more", not one that finished or failed): each of them asks again, or its failure
gives its splits back for its next attempt, so no split is left unread. A reader whose
pace is not known yet (its first split) is never held back and counts for nothing; with
more than ``END_GAME_READERS`` readers asking the end game is not played (it costs a pass
over them per request).

Every operation is amortised O(1) (a request in the end game: O(readers asking)); the
snapshot is small when assignment is orderly (index ranges), and ``restore(snapshot())``
equals the original.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

__all__ = ["SplitAssigner", "ranges", "unranges", "END_GAME_READERS"]

END_GAME_READERS = 256
"""Above this many readers asking at once, no reader is held back (see the module doc)."""


def ranges(indices: Sequence[int]) -> list[list[int]]:
    """Sorted indices as ``[first, last_exclusive]`` runs: [1,2,3,7] -> [[1,4],[7,8]]."""
    out: list[list[int]] = []
    for i in sorted(indices):
        if out and out[-1][1] == i:
            out[-1][1] = i + 1
        else:
            out.append([i, i + 1])
    return out


def unranges(runs: Sequence[Sequence[int]]) -> list[int]:
    return [i for a, b in runs for i in range(a, b)]


class SplitAssigner:
    """Assignment state of one source vertex's splits."""

    def __init__(
        self, hosts: Sequence[Sequence[str]] | int, readers: int | None = None, scheduled: bool = False
    ) -> None:
        """``hosts``: per split, its preferred hosts (or just the number of splits);
        ``readers``: the source's parallelism (None: no share is kept for late readers);
        ``scheduled``: shares are kept only for readers reported ``schedule``d (see the
        module doc), else for every reader that has not asked."""
        if isinstance(hosts, int):
            hosts = [()] * hosts
        self.n = len(hosts)
        self.readers = readers
        self.arrived: set[int] = set()
        """Subtasks whose current attempt has asked (or that finished)."""
        self.scheduled: set[int] | None = set() if scheduled else None
        """Subtasks whose current attempt holds a slot (None: not tracked)."""
        self._hosts = [tuple(h) for h in hosts]
        self._taken = bytearray(self.n)  # 1: assigned (held) or done
        self._count = 0  # how many are 1
        self._cursor = 0  # every split below it is taken or in _returned
        self._returned: deque[int] = deque()
        self._by_host: dict[str, deque[int]] = {}
        for i, hs in enumerate(self._hosts):
            for h in hs:
                self._by_host.setdefault(h, deque()).append(i)
        self.held: dict[int, list[int]] = {}
        """Per subtask, the splits its current attempt holds (in the order it got them)."""
        self.done = 0
        self.asked: dict[int, int] = {}
        """Per subtask whose current attempt is still asking (not told "no more", not
        finished or failed), when it last asked (ms; only requests that said when)."""
        self.pace: dict[int, int] = {}
        """Per subtask in ``asked``, the ms between its current attempt's last two requests."""

    # --- operations ---
    def next(self, subtask: int, host: str = "", now: int | None = None) -> int | None:
        """The split ``subtask`` gets next (None: none left for it). ``now``: when it asked
        (ms, from the log), for the end game; None: not known. The log's wall-clock stamps on
        purpose, not a monotonic clock: the coordinator is rebuilt by folding its facts, and
        must decide on a replay as it did live; a step of the leader's clock only misjudges
        one reader's pace (a heuristic of who reads the last splits, no deadline), and one
        back is not counted."""
        self.arrived.add(subtask)
        if now is not None:
            last = self.asked.get(subtask)
            if last is not None and now > last:
                self.pace[subtask] = now - last
            else:  # its first request, or the clock went back (another leader's): not known
                self.pace.pop(subtask, None)
            self.asked[subtask] = now
        i = self._pick(subtask, host, now)
        if i is None:
            self._stop_asking(subtask)
        return i

    def _stop_asking(self, subtask: int) -> None:
        """Its current attempt will not ask again (told "no more", finished or failed): it
        is no longer counted on, and a next attempt starts without a pace."""
        self.asked.pop(subtask, None)
        self.pace.pop(subtask, None)

    def schedule(self, subtask: int) -> None:
        """``subtask``'s current attempt was given a slot: it will ask (its share is kept)."""
        if self.scheduled is not None:
            self.scheduled.add(subtask)

    def _late(self) -> int:
        """Readers whose current attempt has not asked yet (and holds a slot, when tracked)."""
        assert self.readers  # (only asked with readers)
        if self.scheduled is None:
            return self.readers - len(self.arrived)
        return len(self.scheduled - self.arrived)

    def _pick(self, subtask: int, host: str, now: int | None) -> int | None:
        if self.readers:
            late = self._late()
            if late > 0 and self.remaining <= late * (self.n // self.readers):
                return None  # what is left is theirs
        if now is not None and self._others_finish_first(subtask, now):
            return None
        i = self._local(host) if host else None
        if i is None:
            while self._returned and self._taken[self._returned[0]]:
                self._returned.popleft()
            if self._returned:
                i = self._returned.popleft()
            else:
                while self._cursor < self.n and self._taken[self._cursor]:
                    self._cursor += 1
                if self._cursor == self.n:
                    return None
                i = self._cursor
        self._taken[i] = 1
        self._count += 1
        self.held.setdefault(subtask, []).append(i)
        return i

    def _others_finish_first(self, subtask: int, now: int) -> bool:
        """Whether the other readers still asking would finish every split left before
        ``subtask`` finished one more (the end game, in the module doc)."""
        mine = self.pace.get(subtask)
        left = self.remaining
        if mine is None or left == 0 or len(self.asked) > END_GAME_READERS:
            return False
        deadline = now + mine  # when this reader would finish the split it asks for
        can = 0
        for other, asked in self.asked.items():
            pace = self.pace.get(other)
            if other == subtask or pace is None:
                continue
            if now - asked > 2 * pace:
                continue  # silent for twice its pace: not counted on (it may be stuck)
            free = max(now, asked + pace)  # when it asks next, done with what it holds
            if free < deadline:
                can += (deadline - 1 - free) // pace  # splits it would finish before the deadline
                if can >= left:
                    return True
        return False

    def _local(self, host: str) -> int | None:
        q = self._by_host.get(host)
        while q:
            i = q.popleft()
            if not self._taken[i]:
                return i
        return None

    def give_back(self, subtask: int) -> list[int]:
        """The subtask's attempt failed: what it held goes back to the pool (first in line)."""
        back = self.held.pop(subtask, [])
        self.arrived.discard(subtask)  # its next attempt asks again
        if self.scheduled is not None:
            self.scheduled.discard(subtask)  # ... once it is given a slot
        self._stop_asking(subtask)
        for i in reversed(back):  # the pool's order and each host's order stay the same
            self._taken[i] = 0
            self._count -= 1
            for h in self._hosts[i]:
                self._by_host[h].appendleft(i)
        self._returned.extendleft(reversed(back))
        return back

    def finish(self, subtask: int) -> list[int]:
        """The subtask's attempt finished: what it held is done."""
        done = self.held.pop(subtask, [])
        self.done += len(done)
        self.arrived.add(subtask)  # it will not ask again: nothing is kept for it
        self._stop_asking(subtask)
        return done

    @property
    def remaining(self) -> int:
        """Splits not assigned to anyone right now."""
        return self.n - self._count

    def pool(self) -> list[int]:
        """The unassigned splits, in the order they will be handed out (ignoring locality)."""
        seen = [i for i in dict.fromkeys(self._returned) if not self._taken[i]]
        first = set(seen)
        return seen + [i for i in range(self._cursor, self.n) if not self._taken[i] and i not in first]

    # --- checkpoints ---
    def snapshot(self) -> dict[str, Any]:
        taken_ahead = [i for i in range(self._cursor, self.n) if self._taken[i]] if self._cursor < self.n else []
        return {
            "n": self.n,
            "cursor": self._cursor,
            "returned": [i for i in dict.fromkeys(self._returned) if not self._taken[i]],
            "taken_ahead": ranges(taken_ahead),
            "held": {str(s): ranges(v) if _sorted(v) else v for s, v in sorted(self.held.items())},
            "done": self.done,
            **({"arrived": sorted(self.arrived)} if self.readers else {}),
            **({"scheduled": sorted(self.scheduled)} if self.readers and self.scheduled is not None else {}),
            **({"asked": {str(k): v for k, v in sorted(self.asked.items())}} if self.asked else {}),
            **({"pace": {str(k): v for k, v in sorted(self.pace.items())}} if self.pace else {}),
        }

    @classmethod
    def restore(
        cls,
        hosts: Sequence[Sequence[str]] | int,
        snap: dict[str, Any],
        readers: int | None = None,
        scheduled: bool = False,
    ) -> SplitAssigner:
        a = cls(hosts, readers, scheduled)
        if a.scheduled is not None:  # a checkpoint from before slots were tracked: every reader counted, as then
            a.scheduled = set(snap["scheduled"]) if "scheduled" in snap else set(range(readers or 0))
        # A checkpoint from before shares were kept does not say who asked: keep none (a
        # share kept for a reader that already finished would never be taken).
        a.arrived = set(snap["arrived"]) if "arrived" in snap else set(range(readers or 0))
        if snap.get("n") != a.n:
            raise ValueError(f"the checkpoint is for {snap.get('n')} splits but the plan has {a.n}")
        a._cursor = int(snap["cursor"])
        for i in range(a._cursor):
            a._taken[i] = 1
        for i in unranges(snap["taken_ahead"]):
            a._taken[i] = 1
        for i in snap["returned"]:
            a._taken[i] = 0
        a._returned = deque(snap["returned"])
        for i in reversed(snap["returned"]):
            for h in a._hosts[i]:
                a._by_host[h].appendleft(i)
        a.held = {}
        for s, v in snap["held"].items():
            held = unranges(v) if v and isinstance(v[0], list) else list(v)
            a.held[int(s)] = held
            for i in held:
                a._taken[i] = 1
        a.done = int(snap["done"])
        a.asked = {int(k): int(v) for k, v in snap.get("asked", {}).items()}
        a.pace = {int(k): int(v) for k, v in snap.get("pace", {}).items()}
        a._count = sum(a._taken)
        return a

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SplitAssigner) and self.snapshot() == other.snapshot() and self.pool() == other.pool()


def _sorted(v: list[int]) -> bool:
    return all(a < b for a, b in zip(v, v[1:]))
