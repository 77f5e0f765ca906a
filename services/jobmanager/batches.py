"""One read of the leader's inboxes, and its routing.

A read takes up to ``batch`` entries from every inbox the leader follows (the cluster's
and each job's). A read that brought only reports deciding nothing yet waits a moment for
what usually follows them (``LINGER_MS``). Then the batch is routed: cluster messages one
by one, each job's messages together (decided in order and committed in one group commit:
services/jobmanager/job_inboxes.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sluice.errors import DuplicateCommit, HandlerFailed, MessageRejected, RedisUnavailable, StaleEpoch, StoreRestarted
from sluice.events import TaskOperationResult, TaskState, UpdateTaskExecutionState
from sluice.store import GroupConsumer
from sluice.store.consumer import Entry

__all__ = ["LINGER_MS", "Read", "can_wait", "read_batch", "route"]

LINGER_MS = 5
"""A batch of reports that decide nothing yet (a task's start acknowledged, INITIALIZING,
RUNNING) waits at most this long for more before it is decided: a short task's end comes
a millisecond or two after its start, and both are then one commit, not two (the leader's
CPU a task, ``scripts/bench tasks``). A batch with anything else in it is decided at once."""


def can_wait(entry: Entry) -> bool:
    """Whether a message decides nothing that should not wait a few milliseconds: a task's
    start acknowledged, or a task reaching INITIALIZING or RUNNING (no slot frees, nothing is
    deployed, no one waits on it)."""
    ev = entry.envelope.event
    if isinstance(ev, UpdateTaskExecutionState):
        return ev.state in (TaskState.INITIALIZING, TaskState.RUNNING)
    return isinstance(ev, TaskOperationResult) and ev.success


@dataclass
class Read:
    entries: list[Entry]
    caught_up: bool
    """Whether the cluster inbox was read to its end (fewer entries than a batch were left)."""


def read_batch(
    consumer: GroupConsumer, inbox: str, batch: int, block_ms: int | None, linger_ms: int, logger: Any
) -> Read:
    """Read a batch (``inbox``: the cluster's); wait ``linger_ms`` more when it holds only
    reports that can wait and the read may block (``block_ms``)."""
    entries = consumer.read(count=batch, block_ms=block_ms)
    taken = consumer.taken_over  # a deposed leader's reads, decided where they were sent
    caught_up = consumer.read_counts.get(inbox, 0) < batch
    if entries and block_ms and linger_ms and len(entries) < batch and all(map(can_wait, entries)):
        # Only reports that decide nothing yet: wait a moment for what usually follows
        # them (a task's RUNNING and end), to decide it all in one commit, not two.
        left = batch - len(entries)
        entries += consumer.read(count=left, block_ms=linger_ms)
        taken += consumer.taken_over
        caught_up = consumer.read_counts.get(inbox, 0) < left
    if taken:
        logger.warning(
            "took over messages a deposed leader read after losing its lease; deciding them "
            "in the order they were sent",
            entries=taken,
        )
    return Read(entries, caught_up)


def route(
    entries: list[Entry],
    inbox: str,
    *,
    cluster: Callable[[Entry], None],
    job: Callable[[str, list[Entry]], None],
    park: Callable[[Entry, str, str], None],
) -> None:
    """Cluster messages (``inbox``) one by one to ``cluster`` (one it rejects is parked);
    each job's messages together to ``job(stream, entries)``. No entry is routed twice."""
    seen: set[tuple[str, str]] = set()
    by_job: dict[str, list[Entry]] = {}
    for entry in entries:
        key = (entry.stream, entry.id)
        if key in seen:
            continue  # never decide one entry twice
        seen.add(key)
        if entry.stream == inbox:
            try:
                cluster(entry)
            except MessageRejected as exc:
                park(entry, exc.kind, str(exc))
            except (StaleEpoch, StoreRestarted, RedisUnavailable, DuplicateCommit, HandlerFailed):
                raise
            except Exception as exc:
                raise HandlerFailed(entry, exc) from exc
        else:
            by_job.setdefault(entry.stream, []).append(entry)
    for stream, group in by_job.items():
        job(stream, group)
