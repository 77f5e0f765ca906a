"""The slots jobs' attempts hold on the TaskManagers, as the JobManager's view of jobs folds
them (services/jobs/state.py ``JobsState.pool``), with its indexes by task and by job."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["SlotPool"]


@dataclass
class SlotPool:
    """Which executions hold which TaskManager slot: (taskmanager, slot) -> {(job, execution id)}.

    A slot is free when nothing holds it. Each execution takes and leaves its own slot, so
    the pool does not depend on the order jobs are folded in: replaying one job after
    another, a later job's attempt may take a slot before an earlier job's attempt is seen
    to leave it (for a moment two hold it; in a correct log never at the end)."""

    used: dict[tuple[str, int], set[tuple[str, str]]] = field(default_factory=dict)
    by_taskmanager: dict[str, set[int]] = field(default_factory=dict)
    placed: dict[str, int] = field(default_factory=dict, compare=False, repr=False)
    """Task id ("job/execution id") -> how many slots it holds (one, in a correct log): an
    index of ``used``, so whether an attempt is placed is known without a scan."""
    by_job: dict[str, set[tuple[str, int, str]]] = field(default_factory=dict, compare=False, repr=False)
    """Job id -> the (taskmanager, slot, execution id) its attempts hold: an index of ``used``,
    so a job's slots are known without a scan of every job's (snapshots, archiving)."""

    def take(self, tm: str, slot: int, job: str, eid: str) -> None:
        holders = self.used.setdefault((tm, slot), set())
        if (job, eid) not in holders:
            holders.add((job, eid))
            task_id = f"{job}/{eid}"
            self.placed[task_id] = self.placed.get(task_id, 0) + 1
            self.by_job.setdefault(job, set()).add((tm, slot, eid))
        self.by_taskmanager.setdefault(tm, set()).add(slot)

    def give_back(self, tm: str | None, slot: int | None, job: str, eid: str) -> None:
        """The execution ``eid`` of ``job`` leaves its slot."""
        if tm is None or slot is None:
            return
        holders = self.used.get((tm, slot))
        if holders is None:
            return
        if (job, eid) in holders:
            holders.discard((job, eid))
            task_id = f"{job}/{eid}"
            if self.placed[task_id] > 1:
                self.placed[task_id] -= 1
            else:
                del self.placed[task_id]
            held = self.by_job[job]
            held.discard((tm, slot, eid))
            if not held:
                del self.by_job[job]
        if not holders:
            del self.used[(tm, slot)]
            slots = self.by_taskmanager.get(tm)
            if slots is not None:
                slots.discard(slot)

    def held_by(self, job: str) -> list[tuple[str, int, str]]:
        """The (taskmanager, slot, execution id) the job's attempts hold, sorted."""
        return sorted(self.by_job.get(job, ()))

    def holds(self, job: str) -> bool:
        """Whether any attempt of the job holds a slot."""
        return job in self.by_job

    def holders(self) -> list[tuple[str, int, str, str]]:
        """Every (taskmanager, slot, job, execution id) held, sorted."""
        return sorted((tm, slot, job, eid) for (tm, slot), held in self.used.items() for job, eid in held)
