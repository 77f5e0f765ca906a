"""How long, on the leader's own monotonic clock, a job has waited for slots and a restarted
attempt for its delay: pure, soft state, as the heartbeat monitor is.

The log's times are wall-clock stamps (``env.ts``), written by whichever leader committed
them. Comparing them with this leader's wall clock measured a timeout across two clocks,
and across an NTP step: a leader whose clock stepped 10 s forward failed a slot wait 10 s
early and started a restart's next attempt before its delay; one stepped back put both
off by 10 s. A duration measured on one process's monotonic clock cannot live in the log
(replay must equal live state), so the leader keeps, beside its state, when *it* first saw
each wait: a new leader starts every clock again from when it first looked, which can
only make a timeout later, never earlier. The cores decide on these durations; the shell
passes the clock in (``monotonic_ms``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.events import TaskState

from .state import Execution, JobRun, JobsState

__all__ = ["Timers"]

_RestartKey = tuple[str, str, int, int]
"""(job, vertex, subtask, attempt): one restarted attempt."""


@dataclass
class Timers:
    """First-seen times (the leader's monotonic clock, ms) of what is pending."""

    waits: dict[str, tuple[tuple[int, int], int]] = field(default_factory=dict)
    """Job -> (the log's stamps of its wait: its start, its last slot taken; when first seen
    so). New stamps (a slot taken) start the clock again, as they do in the log."""
    restarts: dict[_RestartKey, int] = field(default_factory=dict)
    """A restarted attempt -> when its restart was seen: committed by this leader, or ``started``."""
    started: int | None = None
    """When this leadership began: restarts committed before it count from here (they were
    committed before it, so never early)."""

    def slot_wait(self, job: JobRun, clock: int) -> int:
        """How long ``job`` (waiting for slots) has waited, on this clock, since its wait
        began or it last took a slot, whichever the log says is later."""
        assert job.waiting_since is not None
        stamps = (job.waiting_since, job.slot_taken_at or 0)
        seen = self.waits.get(job.job_id)
        if seen is None or seen[0] != stamps:
            seen = self.waits[job.job_id] = (stamps, clock)
        return clock - seen[1]

    def restart_seen(self, job_id: str, vertex: str, subtask: int, attempt: int, clock: int) -> None:
        """A restart as ``attempt`` was committed now (its delay counts from here)."""
        self.restarts.setdefault((job_id, vertex, subtask, attempt), clock)

    def held_back(self, job_id: str, ex: Execution, clock: int) -> bool:
        """Whether a restarted attempt's delay (``not_before`` less the restart's own stamp:
        both one leader's wall clock at one moment, so their difference is the delay it
        chose) is not yet over on this clock."""
        delay = ex.not_before - ex.since
        if delay <= 0:
            return False
        first = self.restarts.setdefault(
            (job_id, ex.vertex, ex.subtask, ex.attempt), clock if self.started is None else self.started
        )
        return clock - first < delay

    def keep(self, state: JobsState) -> None:
        """Forget waits that ended and restarts whose attempt left CREATED (or was replaced)."""
        self.waits = {
            j: w
            for j, w in self.waits.items()
            if (job := state.jobs.get(j)) is not None and job.waiting_since is not None
        }

        def pending(key: _RestartKey) -> bool:
            job = state.jobs.get(key[0])
            vertex = job.vertices.get(key[1]) if job is not None else None
            if vertex is None or not 0 <= key[2] < len(vertex.subtasks):
                return False
            ex = vertex.subtasks[key[2]]
            return ex.attempt == key[3] and ex.state == TaskState.CREATED

        self.restarts = {k: at for k, at in self.restarts.items() if pending(k)}
