"""A TaskManager's owed reports: all sent in one round trip, none lost when Redis refuses one."""

from __future__ import annotations

from pathlib import Path

from sluice.events import TaskOperationResult
from sluice.services.taskmanager.process import REFUSED_FOR_MS
from sluice.store import EventLog
from tests.services.failover_helpers import ManualWorld, TinySlots, tm


def owe(t, job: str, execution: str) -> None:  # type: ignore[no-untyped-def]
    t._to_job(job, TaskOperationResult(job, execution, True, None), flush=False)


def inbox_events(log: EventLog, job: str) -> list[str]:
    return [env.event.execution_id for _, env in log.replay(log.keys.inbox(log.keys.job(job)))]


def test_owed_reports_arrive_in_order_and_are_no_longer_owed(log: EventLog, tmp_path: Path) -> None:
    t = tm(log, ManualWorld(), tmp_path, TinySlots())
    for i in range(3):
        owe(t, "j1", f"e{i}")
    owe(t, "j2", "e9")
    t._flush()
    assert not t.owed
    assert inbox_events(log, "j1") == ["e0", "e1", "e2"]
    assert inbox_events(log, "j2") == ["e9"]


def test_a_report_redis_refuses_stays_owed_and_the_others_go(log: EventLog, tmp_path: Path) -> None:
    """A report whose inbox refuses it (the key is not a stream) stays owed, in order with
    the later ones to that inbox, and holds back none to other inboxes (it held back every
    report behind it, for ever when nothing made the inbox again); the others go once."""
    world = ManualWorld()
    t = tm(log, world, tmp_path, TinySlots())
    bad = log.keys.inbox(log.keys.job("bad"))
    log.backend.set(bad, b"not a stream")  # a key of the wrong kind where the job's inbox should be
    owe(t, "j1", "e0")
    owe(t, "bad", "e1")
    owe(t, "j1", "e2")
    owe(t, "bad", "e3")
    t._flush()
    assert inbox_events(log, "j1") == ["e0", "e2"]  # once each
    assert [env.event.execution_id for _, env in t.owed] == ["e1", "e3"]
    t._flush()  # still refused: still owed, nothing sent twice
    assert inbox_events(log, "j1") == ["e0", "e2"] and len(t.owed) == 2
    log.backend.delete(bad)  # (its reader makes the inbox again: services/jobmanager)
    t._flush()
    assert not t.owed
    assert inbox_events(log, "bad") == ["e1", "e3"]
    # Refused for REFUSED_FOR_MS (no leader reads it any more: its job ended): parked with
    # the reason in the job's dead letters, and no longer owed.
    log.backend.delete(bad)
    log.backend.set(bad, b"not a stream")
    owe(t, "bad", "e4")
    t._flush()
    world.advance(REFUSED_FOR_MS)
    t._flush()
    assert not t.owed
    ((_, dead),) = list(log.replay_raw(log.keys.dead(log.keys.job("bad"))))
    assert dead[b"kind"] == b"undeliverable" and b"refused the report for 30 s" in dead[b"reason"]
    assert dead[b"stream"].decode() == bad and b"e4" in dead[b"field:e"]


def test_the_inbox_is_left_with_nothing_pending_after_a_job(log: EventLog, tmp_path: Path) -> None:
    """Entries are acknowledged a batch at a time: none is left pending once they are handled."""
    from sluice.events import TaskState
    from tests.services.failover_helpers import job_state, pump, report, source_graph, started, submit

    world, a, t, slots = started(log, tmp_path)
    steps = [lambda: a.step(block_ms=None), lambda: t.step(block_ms=None)]
    submit(log, world, "j1", source_graph("j1", parallelism=2))
    pump(steps, lambda: len(slots.launched) == 2, what="both deployed", world=world, advance_ms=10)
    for slot, d, _ in slots.launched:
        report(log, world, d, "tm-1", slot, TaskState.RUNNING)
        report(log, world, d, "tm-1", slot, TaskState.FINISHED)
    pump(steps, lambda: job_state(log, "j1").status.value == "FINISHED", what="the job's end", world=world,
         advance_ms=10)
    t.step(block_ms=None)
    group = t.consumer.group
    state = log.backend.group_state(t.inbox, group)
    assert state is not None and state.pending == 0
