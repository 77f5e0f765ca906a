"""Planted bugs: how well the simulation finds what it is for.

Each plant puts one known bug back into the code of the process that runs it (by patching
a function, never by changing a file): the bugs issue 9 named, and each finding of issue
28 undone. ``scripts/simulate --plant NAME --all-faults --seeds 1000 --stop-after 1`` says
how many seeds the simulation took to catch it; ``--campaign`` runs every plant that way and
prints the table. A plant nobody catches within 1,000 seeds means an invariant or a fault
kind is missing. Plants never run outside the simulation's worker processes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["PLANTS", "Plant", "plant"]


@dataclass(frozen=True)
class Plant:
    issue: str
    bug: str
    apply: Callable[[], None]


def _patch(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
    """Replace ``owner.name`` by ``make(original)``."""
    setattr(owner, name, make(getattr(owner, name)))


def _no_fence() -> None:
    from sluice.store.memory import MemoryStore

    def make(commit: Any) -> Any:
        def planted(self: Any, keys: list[str], argv: list[bytes], now: int) -> Any:
            fence = self._get(keys[0], now)
            if fence is not None and int(argv[0]) < int(fence):  # the commit runs as if its epoch were current
                argv = [fence, *argv[1:]]
            return commit(self, keys, argv, now)

        return planted

    _patch(MemoryStore, "_commit", make)


def _no_redelivery_check() -> None:
    from sluice.store.memory import MemoryStore

    def make(commit: Any) -> Any:
        def planted(self: Any, keys: list[str], argv: list[bytes], now: int) -> Any:
            n = int(argv[3])
            group = argv[2].decode()
            if group and n and not all(self._is_pending(keys[1], group, argv[4 + i].decode(), now) for i in range(n)):
                argv = [*argv[:2], b"", *argv[3:]]  # consumed before: applied again instead of a no-op
            return commit(self, keys, argv, now)

        return planted

    _patch(MemoryStore, "_commit", make)


def _splits_kept() -> None:
    from sluice.services.coordination.assigner import SplitAssigner

    def planted(self: Any, subtask: int) -> list[int]:  # the failed attempt's splits are lost, not given back
        self.held.pop(subtask, [])
        self.arrived.discard(subtask)
        self._stop_asking(subtask)
        return []

    SplitAssigner.give_back = planted  # type: ignore[method-assign]


def _outbox_reordered() -> None:
    from sluice.store.outbox import Deliverer

    def make(deliver_page: Any) -> Any:
        def planted(self: Any, by_target: dict[str, list[object]], server: str) -> int:
            swapped = {}
            for target, flat in by_target.items():
                pairs = [flat[i : i + 2] for i in range(0, len(flat), 2)]
                swapped[target] = [x for pair in reversed(pairs) for x in pair]  # a page's entries, last first
            return deliver_page(self, swapped, server)

        return planted

    _patch(Deliverer, "_deliver_page", make)


def _state_kept() -> None:
    from sluice.events import TaskState, UpdateTaskExecutionState
    from sluice.services.kvstate import core

    def make(released: Any) -> Any:
        def planted(job: Any, ev: Any) -> list:
            if type(ev) is UpdateTaskExecutionState and ev.state in (TaskState.FAILED, TaskState.CANCELED):
                return []  # a failed attempt keeps its queryable state registered
            return list(released(job, ev))

        return planted

    _patch(core, "released", make)


def _deposed_read() -> None:
    from sluice.store.consumer import GroupConsumer

    GroupConsumer._take_over = lambda self, read, streams: read  # type: ignore[method-assign]


def _unreadable_spin() -> None:
    from sluice.services.jobmanager.process import JobManager

    def planted(self: Any, exc: Any) -> None:  # as before: an error, a rebuild at once, the lease kept
        self._unexpected(exc, "unexpected error in the main loop")
        self.step_down()

    JobManager._cannot_read = planted  # type: ignore[method-assign]


def _loss_forgotten() -> None:
    from dataclasses import replace

    from sluice.services.jobs import core

    orphans = core._HANDLERS[core.Orphans]

    def planted(state: Any, stimulus: Any, now: int) -> Any:
        return orphans(state, replace(stimulus, registered=None), now)  # the registrations' epochs not looked at

    core._HANDLERS[core.Orphans] = planted


def _nogroup_at_start() -> None:
    from sluice.errors import WrongType
    from sluice.store.consumer import GroupConsumer

    def planted(self: Any) -> None:  # skip_to_end as it was: NOGROUP from SETID escapes
        for s in self.streams:
            self._ensure(s, "$")
            try:
                self.log.backend.group_setid(s, self.group, "$")
            except WrongType:
                self.set_aside([s])
        while True:
            stale = self._read("0", 1000, None)
            if not stale:
                return
            for s in self.streams:
                ids = [e.id for e in stale if e.stream == s]
                if ids:
                    self.ack(*ids, stream=s)

    GroupConsumer.skip_to_end = planted  # type: ignore[method-assign]


def _untrimmed() -> None:
    from sluice.services.jobmanager.retention import Retention

    Retention.tick = lambda self, now: None  # type: ignore[method-assign]
    Retention.release = lambda self, job_ids: None  # type: ignore[method-assign]


def _wall_clock_timeouts() -> None:
    from sluice.services.jobmanager import cluster

    cluster.monotonic_ms = lambda world: world.now_ms()  # heartbeats timed on the wall clock


PLANTS: dict[str, Plant] = {
    "no_fence": Plant("9", "a commit below its tag's fence is not refused", _no_fence),
    "no_redelivery_check": Plant("9", "a commit of entries already consumed is applied again", _no_redelivery_check),
    "splits_kept": Plant("9", "a failed attempt's splits are not given back", _splits_kept),
    "outbox_reordered": Plant("9", "outbox entries are delivered out of order", _outbox_reordered),
    "state_kept": Plant("9", "a failed attempt's queryable state is not unregistered", _state_kept),
    "deposed_read": Plant("28.1", "what a deposed leader read is decided after later messages", _deposed_read),
    "unreadable_spin": Plant(
        "28.2", "a leader that cannot read the log keeps the lease and retries at once", _unreadable_spin
    ),
    "loss_forgotten": Plant(
        "28.3", "a loss a dead leader committed is forgotten when the TaskManager is back", _loss_forgotten
    ),
    "nogroup_at_start": Plant(
        "28.4", "a TaskManager's start fails when its inbox is made again under it", _nogroup_at_start
    ),
    "untrimmed": Plant("28.5", "transport streams are never trimmed, an archived job's never deleted", _untrimmed),
    "wall_clock_timeouts": Plant(
        "28+", "the leader times heartbeats on its wall clock (found by clock_skew)", _wall_clock_timeouts
    ),
}


def plant(name: str) -> None:
    """Put bug ``name`` into this process's code (for the simulation's workers only)."""
    if name not in PLANTS:
        raise KeyError(f"no plant {name!r}; the plants are {', '.join(PLANTS)}")
    PLANTS[name].apply()
