"""The leader's soft memory of slot reports (services/jobs/reconcile.py): per TaskManager, the
differences seen and since when, the cancels sent; the reads of its inboxes, what it last
heard of each attempt, when it deployed them, and the final states kept until taken. Soft
state, like the heartbeat monitor: a new leader starts it afresh.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Container
from dataclasses import dataclass, field

from sluice.events import AttemptReport

__all__ = ["Memory", "PerTaskManager", "Seen", "split_task_id"]


@dataclass
class Seen:
    """One difference: first seen at ``since``, in ``reports`` consecutive reports."""

    since: int
    reports: int = 1


@dataclass
class PerTaskManager:
    """What the leader remembers of one TaskManager's slot reports."""

    differences: dict[tuple[str, str], Seen] = field(default_factory=dict)
    """(kind, task id) -> when first seen; kind: missing, unknown, final, finished."""
    cancelled: dict[str, int] = field(default_factory=dict)
    """Task id -> when a cancel was last sent for it (sent again after the grace period)."""


@dataclass
class Memory:
    """The leader's soft memory of slot reports, per TaskManager."""

    taskmanagers: dict[str, PerTaskManager] = field(default_factory=dict)
    leading_since: int = 0
    """When this leader began (deployment timeouts count from then at the earliest), on the
    clock deployment timeouts are measured on: the leader's monotonic clock (``deployed``)."""
    deployed: dict[str, int] = field(default_factory=dict)
    """Task id -> when this leader committed the attempt's deployment, on its monotonic
    clock. Not the log's stamp (``Execution.since``): that is some leader's wall clock, and
    a deadline across two clocks, or across an NTP step, fails deployments early or late.
    Attempts deployed before this leadership count from ``leading_since``: later, never
    earlier, than their deployment."""
    batch: int = 0
    """The number of the leader's current read of its inboxes (from 1)."""
    fresh: int = -1
    """The latest read before the current one that reached the end of the cluster inbox."""
    reading: bool = False
    """True while the entries of a read (not old ones reclaimed) are handled."""
    finals: dict[str, tuple[int, str, AttemptReport]] = field(default_factory=dict)
    """Task id -> (the read that brought it, TaskManager, line): final states reported for
    attempts the leader still has running, until taken or no longer reported."""
    accepted: list[str] = field(default_factory=list)
    """Task ids whose final state was taken from a slot report (for the log; the shell empties it)."""
    heard_at: dict[str, int] = field(default_factory=dict)
    """Task id -> the read in which a message about the attempt last came from its side."""
    finals_on: dict[str, set[str]] = field(default_factory=dict)
    """TaskManager -> the task ids of ``finals`` it reported: an index, so a report does not
    scan every TaskManager's finals (thousands while a big job's sources end)."""
    final_jobs: dict[str, int] = field(default_factory=dict)
    """Job id -> how many of ``finals`` are its attempts' (so none is looked at while no such
    job's inbox was read to its end)."""
    _caught_up: int = -1

    def read(self, caught_up: bool) -> None:
        """The leader read its inboxes (``caught_up``: to the end of the cluster inbox)."""
        self.batch += 1
        self.fresh = self._caught_up
        if caught_up:
            self._caught_up = self.batch

    def heard(self, task_id: str) -> None:
        """A message from the attempt's TaskManager or worker is being handled."""
        self.heard_at[task_id] = self.batch

    def evidence(self, task_id: str) -> bool:
        """Whether the report being handled was sent after the leader last heard of the
        attempt (0: before this leadership, when the log already had it)."""
        return self.reading and self.heard_at.get(task_id, 0) <= self.fresh

    def keep(self, task_ids: Container[str]) -> None:
        """Forget what was heard of attempts not placed anywhere (none comes back: a placed
        attempt only leaves, and a new attempt has a new id)."""
        self.heard_at = {t: b for t, b in self.heard_at.items() if t in task_ids}
        self.deployed = {t: at for t, at in self.deployed.items() if t in task_ids}

    def forget(self, resource_id: str) -> None:
        self.taskmanagers.pop(resource_id, None)
        self.finals = {t: f for t, f in self.finals.items() if f[1] != resource_id}
        self.finals_on.pop(resource_id, None)
        self.final_jobs = dict(Counter(split_task_id(task_id)[0] for task_id in self.finals))

    def keep_final(self, task_id: str, resource_id: str, line: AttemptReport) -> None:
        """A final state reported for an attempt the leader still has running (kept if kept already)."""
        if task_id not in self.finals:
            self.finals[task_id] = (self.batch, resource_id, line)
            self.finals_on.setdefault(resource_id, set()).add(task_id)
            job_id = split_task_id(task_id)[0]
            self.final_jobs[job_id] = self.final_jobs.get(job_id, 0) + 1

    def drop_final(self, task_id: str) -> None:
        found = self.finals.pop(task_id, None)
        if found is None:
            return
        if found[1] in self.finals_on:
            self.finals_on[found[1]].discard(task_id)
        job_id = split_task_id(task_id)[0]
        if self.final_jobs.get(job_id, 0) > 1:
            self.final_jobs[job_id] -= 1
        else:
            self.final_jobs.pop(job_id, None)

    def unanswered(self, resource_id: str, task_id: str) -> bool:
        """Whether the TaskManager's reports (two at least, each sent after the deployment)
        have gone on not listing the attempt, held or ended."""
        mem = self.taskmanagers.get(resource_id)
        seen = mem.differences.get(("deploying", task_id)) if mem is not None else None
        return seen is not None and seen.reports >= 2


def split_task_id(task_id: str) -> tuple[str, str]:
    job_id, _, execution_id = task_id.partition("/")
    return job_id, execution_id
