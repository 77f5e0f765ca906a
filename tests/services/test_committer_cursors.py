"""The leader's committer owes its outboxes' cursor moves (``Deliverer.owed``): the tag's
next commit carries each one, its tick flushes the rest, and a move owed on a server that
restarted since is dropped, never made (the server refuses it: the leader would step down
and rebuild again for each such tag)."""

from __future__ import annotations

from pathlib import Path

import structlog

from sluice.events import TaskState
from sluice.services.jobmanager.committer import Committer
from sluice.store import EventLog
from tests.helpers import heartbeat
from tests.services.failover_helpers import ManualWorld, job_state, pump, report, source_graph, started, submit


def _committer(log: EventLog) -> Committer:
    c = Committer(log, ManualWorld(), "jm-a", "jobmanager", structlog.get_logger("test"))
    c.begin(1, log.server_id())
    return c


def test_a_commit_carries_the_move_its_last_delivery_owes_and_the_tick_flushes_the_last(log: EventLog) -> None:
    c = _committer(log)
    tag, target = log.keys.job("j1"), log.keys.inbox(log.keys.taskmanager("tm-1"))
    cursor = log.keys.outbox_cursor(tag)
    first = c.commit(tag, [], sends=[(target, heartbeat(rid="a"))])
    assert first is not None and log.length(target) == 1  # delivered at once
    assert log.backend.get(cursor) is None  # its cursor's move is owed
    c.commit(tag, [], sends=[(target, heartbeat(rid="b"))])
    moved = log.backend.get(cursor)
    assert moved is not None  # the second commit carried the first delivery's move
    c.flush_cursors()
    assert log.backend.get(cursor) is not None and log.backend.get(cursor) != moved  # the tick, the second's
    assert log.length(target) == 2


def test_a_move_owed_on_a_server_that_restarted_is_dropped_not_made(log: EventLog) -> None:
    c = _committer(log)
    tag, target = log.keys.job("j1"), log.keys.inbox(log.keys.taskmanager("tm-1"))
    other = log.keys.job("j2")
    c.commit(tag, [], sends=[(target, heartbeat(rid="a"))])
    c.commit(other, [], sends=[(target, heartbeat(rid="b"))])
    for d in c._deliverers.values():  # as a restart of Redis leaves them: owed on the server before
        assert d.owed is not None
        d.owed = ("the-run-id-before-the-restart", d.owed[1])
    c.begin(2, log.server_id())  # leading again, on the restarted server
    c.flush_cursors()  # no StoreRestarted: neither move is made, both are forgotten
    assert all(d.owed is None for d in c._deliverers.values())
    assert log.backend.get(log.keys.outbox_cursor(tag)) is None
    assert log.backend.get(log.keys.outbox_cursor(other)) is None


def test_an_archived_jobs_deliverer_is_flushed_and_forgotten(log: EventLog, tmp_path: Path) -> None:
    """The leader forgets a job's deliverer when it archives the job (it kept one per job it
    ever ran, walked at every tick), after moving its cursor to the outbox's end; the outbox
    delivered, it goes with its cursor (services/jobmanager/retention.py)."""
    world, a, t, slots = started(log, tmp_path, n=1)
    submit(log, world, "j1", source_graph("j1", splits=1))
    steps = [lambda: a.step(block_ms=None), lambda: t.step(block_ms=None)]
    pump(steps, lambda: bool(slots.launched), what="the launch", world=world, advance_ms=10)
    tag = log.keys.job("j1")
    assert tag in a.committer._deliverers
    ((_, d, _),) = slots.launched
    report(log, world, d, "tm-1", 0, TaskState.FINISHED)
    pump(
        steps,
        lambda: "j1" not in a.state.jobs.jobs and job_state(log, "j1").ended_at is not None,
        what="the job's end and archive",
        world=world,
        advance_ms=50,
    )
    assert tag not in a.committer._deliverers
    assert not log.backend.exists(log.keys.outbox_cursor(tag), log.keys.outbox(tag))
