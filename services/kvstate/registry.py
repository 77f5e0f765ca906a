"""The per-job KvState registry, folded from the job's facts (no I/O).

Flink's ``KvStateLocationRegistry``: registration name -> ``KvStateLocation`` (the job
vertex, its number of key groups = the job's max parallelism, and for each registered
key-group range the state id and server address). ``evolve`` applies the accepted
notifications (recorded as facts by :mod:`.core`) and ``JobDisposed``; a location goes
away when its last key group is unregistered.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from sluice.events import Event, JobDisposed, JobSubmitted, NotifyKvStateRegistered, NotifyKvStateUnregistered

__all__ = [
    "FACTS",
    "KvStateEntry",
    "KvStateLocation",
    "KvStateRegistry",
    "evolve",
    "is_fact",
    "location_row",
]

FACTS = frozenset({JobSubmitted, NotifyKvStateRegistered, NotifyKvStateUnregistered, JobDisposed})
"""The facts ``evolve`` applies (everything else leaves the registry alone)."""

Fact = JobSubmitted | NotifyKvStateRegistered | NotifyKvStateUnregistered | JobDisposed


def is_fact(ev: Event) -> TypeGuard[Fact]:
    """Whether ``ev`` is one of :data:`FACTS` (each names its job)."""
    return type(ev) in FACTS


@dataclass(frozen=True, slots=True)
class KvStateEntry:
    """Where the state of one key-group range lives, and which attempt registered it."""

    start: int
    end: int
    state_id: str
    address: str
    execution_id: str | None = None


@dataclass(slots=True)
class KvStateLocation:
    job_id: str
    name: str
    vertex: str
    num_key_groups: int
    entries: dict[tuple[int, int], KvStateEntry] = field(default_factory=dict)
    """Registered ranges, never overlapping, by (start, end)."""

    @property
    def registered_key_groups(self) -> int:
        return sum(e.end - e.start + 1 for e in self.entries.values())

    def register(self, entry: KvStateEntry) -> None:
        self.unregister(entry.start, entry.end)
        self.entries[(entry.start, entry.end)] = entry

    def unregister(self, start: int, end: int) -> list[KvStateEntry]:
        """Drop key groups ``start..end`` (a range partly inside keeps its other part);
        returns the entries that lost key groups."""
        hit = [e for (s, t), e in self.entries.items() if s <= end and t >= start]
        for e in hit:
            del self.entries[(e.start, e.end)]
            if e.start < start:
                self.entries[(e.start, start - 1)] = KvStateEntry(
                    e.start, start - 1, e.state_id, e.address, e.execution_id
                )
            if e.end > end:
                self.entries[(end + 1, e.end)] = KvStateEntry(end + 1, e.end, e.state_id, e.address, e.execution_id)
        return hit

    def entry_for(self, key_group: int) -> KvStateEntry | None:
        ranges = sorted(self.entries)
        i = bisect_right(ranges, (key_group, self.num_key_groups)) - 1
        if i >= 0 and ranges[i][0] <= key_group <= ranges[i][1]:
            return self.entries[ranges[i]]
        return None


@dataclass(slots=True)
class KvStateRegistry:
    job_id: str = ""
    num_key_groups: int = 128
    """The job's max parallelism (set by ``JobSubmitted``)."""
    locations: dict[str, KvStateLocation] = field(default_factory=dict)
    state_ids: set[str] = field(default_factory=set)
    """Every state id ever registered (what disposing deletes; deleting twice is harmless,
    so a dispose repeated after a crash still cleans up)."""
    disposed: bool = False


def evolve(reg: KvStateRegistry, ev: Event) -> KvStateRegistry:
    if type(ev) is NotifyKvStateRegistered:
        loc = reg.locations.get(ev.registration_name)
        if loc is None:  # the first registration creates the location
            loc = reg.locations[ev.registration_name] = KvStateLocation(
                ev.job_id, ev.registration_name, ev.vertex_id, reg.num_key_groups
            )
        r = ev.key_group_range
        loc.register(KvStateEntry(r.start, r.end, ev.state_id, ev.server_address, ev.execution_id))
        reg.state_ids.add(ev.state_id)
        reg.disposed = False
    elif type(ev) is NotifyKvStateUnregistered:
        loc = reg.locations.get(ev.registration_name)
        if loc is not None:
            loc.unregister(ev.key_group_range.start, ev.key_group_range.end)
            if not loc.entries:
                del reg.locations[ev.registration_name]
    elif type(ev) is JobSubmitted:
        reg.job_id, reg.num_key_groups = ev.job_id, ev.graph.max_parallelism
    elif type(ev) is JobDisposed:
        reg.locations.clear()
        reg.disposed = True
    return reg


def location_row(loc: KvStateLocation) -> dict[str, Any]:
    """The KvStateLocation table's row (JSON) for one registration name."""
    return {
        "job_id": loc.job_id,
        "name": loc.name,
        "vertex": loc.vertex,
        "num_key_groups": loc.num_key_groups,
        "registered_key_groups": loc.registered_key_groups,
        "ranges": [
            {
                "start": e.start,
                "end": e.end,
                "state_id": e.state_id,
                "address": e.address,
                "execution_id": e.execution_id,
            }
            for _, e in sorted(loc.entries.items())
        ],
    }
