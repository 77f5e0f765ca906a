"""Bounded storage on a real redis-server: every transport stream is trimmed once consumed
and delivered, an archived job's transport keys go (its facts stay), and ``PurgeJob``
removes an ended job's keys, leaving a tombstone (services/jobmanager/retention.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sluice.events import Envelope, JobPurged, JobRefused, JobStatus, PurgeJob, TaskState, descriptor_from_json
from sluice.services.jobmanager import JobManager
from sluice.services.jobmanager.retention import SWEEP_EVERY_MS, FactRetention
from sluice.services.taskmanager.events import TaskEvents
from sluice.store import EventLog
from sluice.store.purge import Tombstones
from tests.services.failover_helpers import (
    ManualWorld,
    TinySlots,
    jm,
    job_state,
    lead,
    pump,
    report,
    source_graph,
    started,
    submit,
)

JOBS = 3


def _run_jobs(log: EventLog, world: ManualWorld, a: JobManager, t: Any, slots: TinySlots, ids: list[str]) -> None:
    """Each job (one source subtask, two splits) to its end: its task asks for every split
    through its subtask inbox (the real reader), then finishes; until the leader archived it."""
    steps = [lambda: a.step(block_ms=None), lambda: t.step(block_ms=None)]
    for job_id in ids:
        before = len(slots.launched)
        submit(log, world, job_id, source_graph(job_id, splits=2))
        pump(steps, lambda n=before: len(slots.launched) > n, what=f"{job_id}'s launch", world=world, advance_ms=10)
        _, d, _ = slots.launched[-1]
        report(log, world, d, "tm-1", 0, TaskState.RUNNING)
        task = TaskEvents(log, descriptor_from_json(d), "host-a", blocking=False, world=world)
        while True:
            task.ask_for_split()
            pump([*steps, task.poll], task.answered, what=f"{job_id}'s split", world=world, advance_ms=10)
            if task.take_split() is None:
                break
        report(log, world, d, "tm-1", 0, TaskState.FINISHED)
        pump(
            steps,
            lambda j=job_id: j in a.snapshots.archived,  # type: ignore[misc,union-attr]
            what=f"{job_id}'s archive",
            world=world,
            advance_ms=50,
        )
    ticks(steps, world)


def ticks(steps: list, world: ManualWorld, n: int = 5) -> None:
    """A few more rounds of the steps, each a tick apart (trims, snapshots)."""
    for _ in range(n):
        for step in steps:
            step()
        world.advance(300)


def _transport(log: EventLog, job_id: str) -> dict[str, int]:
    keys = log.keys
    tag = keys.job(job_id)
    names = {
        "inbox": keys.inbox(tag),
        "outbox": keys.outbox(tag),
        "cursor": keys.outbox_cursor(tag),
        "delivered": keys.delivered(tag),
        "subtask inbox": keys.task_inbox(tag, "src", 0),
    }
    return {what: log.backend.exists(key) for what, key in names.items()}


@pytest.mark.timeout(120)
def test_an_archived_jobs_transport_goes_its_facts_stay_and_the_cluster_streams_are_trimmed(
    log: EventLog, tmp_path: Path
) -> None:
    world, a, t, slots = started(log, tmp_path, n=1)
    a.retention.inbox_retention_ms = t.inbox.retention_ms = 0  # nothing kept for inspection: everything consumed goes
    a.retention.reset()
    t.inbox.next_trim = 0
    ids = [f"j{i}" for i in range(JOBS)]
    _run_jobs(log, world, a, t, slots, ids)
    keys = log.keys
    for job_id in ids:
        assert job_state(log, job_id).status == JobStatus.FINISHED
        assert _transport(log, job_id) == dict.fromkeys(("inbox", "outbox", "cursor", "delivered", "subtask inbox"), 0)
        assert log.length(keys.facts(keys.job(job_id))) > 0  # the facts stay
        marks = log.backend.hkeys(keys.delivered(keys.taskmanager("tm-1")))
        assert keys.outbox(keys.job(job_id)).encode() in marks  # its outbox's mark elsewhere stays until a purge
    # The cluster's inbox and outbox keep at most their last consumed / delivered entry.
    assert log.length(keys.inbox(keys.cluster)) <= 1
    assert log.length(keys.outbox(keys.cluster)) <= 1
    assert log.length(keys.inbox(keys.taskmanager("tm-1"))) <= 1


@pytest.mark.timeout(120)
def test_a_live_jobs_streams_keep_the_retention_window_and_a_finished_subtasks_inbox_is_trimmed(
    log: EventLog, tmp_path: Path
) -> None:
    """Trimming a live job: its inbox up to what the leader acknowledged, its outbox up to
    its cursor, a subtask inbox once its attempt ended; nothing newer than the retention."""
    world, a, t, slots = started(log, tmp_path, n=1)
    a.retention.inbox_retention_ms = 3_600_000
    _run_jobs(log, world, a, t, slots, ["j0"])
    assert _transport(log, "j0")["inbox"] == 0  # archived: released whatever the retention
    assert log.length(log.keys.inbox(log.keys.cluster)) > 1  # recent traffic kept for `sluice inspect tail`


def _purge(log: EventLog, a: JobManager, world: ManualWorld, job_id: str, steps: list) -> Any:
    reply_to = log.keys.inbox(log.keys.client("purger"))
    start = log.last_id(reply_to) or "0-0"
    log.append(
        log.keys.inbox(log.keys.cluster), Envelope(PurgeJob(job_id, reply_to), world.new_id(), 0, world.now_ms())
    )
    pump(steps, lambda: (log.last_id(reply_to) or "0-0") != start, what="the purge's reply", world=world, advance_ms=20)
    ((_, env),) = list(log.replay(reply_to, start))
    return env.event


@pytest.mark.timeout(120)
def test_purge_refuses_an_unknown_and_a_running_job_and_leaves_a_tombstone_for_an_ended_one(
    log: EventLog, tmp_path: Path
) -> None:
    world, a, t, slots = started(log, tmp_path, n=1)
    steps = [lambda: a.step(block_ms=None), lambda: t.step(block_ms=None)]
    _run_jobs(log, world, a, t, slots, ["done"])
    submit(log, world, "live", source_graph("live", splits=2))
    pump(steps, lambda: "live" in a.state.jobs.jobs, what="the live job", world=world, advance_ms=10)

    unknown = _purge(log, a, world, "nope", steps)
    assert isinstance(unknown, JobRefused) and "job not found: nope" in unknown.reason
    running = _purge(log, a, world, "live", steps)
    assert isinstance(running, JobRefused) and "only an ended job can be purged" in running.reason
    assert log.backend.exists(log.keys.facts(log.keys.job("live")))

    done = _purge(log, a, world, "done", steps)
    assert isinstance(done, JobPurged) and done.status == JobStatus.FINISHED and done.ended_at is not None
    assert log.backend.scan_keys(log.keys.tag_pattern(log.keys.job("done"))) == []
    row = Tombstones(log).read("done")
    assert row is not None and row["status"] == "FINISHED" and row["purged_at"] == done.purged_at
    again = _purge(log, a, world, "done", steps)
    assert isinstance(again, JobRefused) and "already purged" in again.reason
    ticks(steps, world, 10)  # ticks, snapshots: nothing comes back
    assert log.backend.scan_keys(log.keys.tag_pattern(log.keys.job("done"))) == []

    from sluice.cli.jobs import table_json

    shown = table_json(log, "done")
    assert shown["status"] == "PURGED" and shown["was"] == "FINISHED" and shown["purged_at"] == done.purged_at

    # A new leader replays a log that names the purged job: it leaves it out, re-creates
    # none of its keys, and the id stays taken.
    a.job_inboxes.close_coordinators()
    a.lease.release()
    b = jm(log, world, "jm-b", tmp_path)
    lead(b, world)
    pump(
        [lambda: b.step(block_ms=None), lambda: t.step(block_ms=None)],
        lambda: b.leading and b.replay is None,
        what="jm-b's rebuild",
        world=world,
        advance_ms=50,
    )
    assert b.errors == []
    assert "done" in b.registered and "done" in b.purged and "done" not in b.state.jobs.jobs
    assert log.backend.scan_keys(log.keys.tag_pattern(log.keys.job("done"))) == []
    b.job_inboxes.close_coordinators()


@pytest.mark.timeout(120)
def test_a_fact_retention_purges_the_oldest_archived_jobs(log: EventLog, tmp_path: Path) -> None:
    world, a, t, slots = started(log, tmp_path, n=1)
    a.retention.facts = FactRetention(keep_last=1)
    _run_jobs(log, world, a, t, slots, ["old", "new"])
    world.advance(SWEEP_EVERY_MS)
    ticks([lambda: a.step(block_ms=None), lambda: t.step(block_ms=None)], world, 2)
    assert Tombstones(log).read("old") is not None and Tombstones(log).read("new") is None
    assert not log.backend.exists(log.keys.facts(log.keys.job("old")))
    assert log.backend.exists(log.keys.facts(log.keys.job("new")))
