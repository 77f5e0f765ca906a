"""A TaskManager's owed reports: all sent in one round trip, none lost when Redis refuses one."""

from __future__ import annotations

from pathlib import Path

from sluice.events import TaskOperationResult, decode
from sluice.services.taskmanager.reports import REFUSED_FOR_MS
from sluice.store import EventLog
from tests.services.failover_helpers import ManualWorld, TinySlots, WrittenAgainAtOnce, tm


def owe(t, job: str, execution: str) -> None:  # type: ignore[no-untyped-def]
    t.reports.to_job(job, TaskOperationResult(job, execution, True, None), flush=False)


def owe_in_turn(t, good: str, bad: str) -> None:  # type: ignore[no-untyped-def]
    """e0 to ``good``, e1 to ``bad``, e2 to ``good``, e3 to ``bad``."""
    for i, job in enumerate((good, bad, good, bad)):
        owe(t, job, f"e{i}")


def inbox_events(log: EventLog, job: str) -> list[str]:
    return [env.event.execution_id for _, env in log.replay(log.keys.inbox(log.keys.job(job)))]


def test_owed_reports_arrive_in_order_and_are_no_longer_owed(log: EventLog, tmp_path: Path) -> None:
    t = tm(log, ManualWorld(), tmp_path, TinySlots())
    for i in range(3):
        owe(t, "j1", f"e{i}")
    owe(t, "j2", "e9")
    t.reports.flush()
    assert not t.reports.owed
    assert inbox_events(log, "j1") == ["e0", "e1", "e2"]
    assert inbox_events(log, "j2") == ["e9"]


def test_reports_to_an_inbox_that_is_not_a_stream_go_at_once_and_its_value_is_kept(
    log: EventLog, tmp_path: Path
) -> None:
    """A job inbox whose key holds another kind of value (it held back every report behind
    it, for ever): the TaskManager moves the value aside, says so, and the reports go, in
    order, once."""
    t = tm(log, ManualWorld(), tmp_path, TinySlots())
    told: list = []
    log.on_set_aside = lambda *a: told.append(a)
    bad = log.keys.inbox(log.keys.job("bad"))
    log.backend.set(bad, b"not a stream")
    owe_in_turn(t, "j1", "bad")
    t.reports.flush()
    assert not t.reports.owed
    assert inbox_events(log, "j1") == ["e0", "e2"] and inbox_events(log, "bad") == ["e1", "e3"]
    ((stream, kind, aside),) = told
    assert (stream, kind) == (bad, "string") and log.backend.get(aside) == b"not a stream"


def test_a_report_refused_again_stays_owed_without_holding_back_the_others_then_is_parked(
    log: EventLog, tmp_path: Path
) -> None:
    """When the inbox cannot be made again (its key is written again at once), its reports
    stay owed, in order, the others go once; refused for REFUSED_FOR_MS, they are parked in
    the job's dead letters with the reason."""
    world = ManualWorld()
    bad = log.keys.inbox(log.keys.job("bad"))
    hostile = EventLog(WrittenAgainAtOnce(log.backend, bad), log.keys)
    t = tm(hostile, world, tmp_path, TinySlots())
    log.backend.set(bad, b"not a stream")
    owe_in_turn(t, "j1", "bad")
    t.reports.flush()
    assert inbox_events(log, "j1") == ["e0", "e2"]  # once each
    assert [env.event.execution_id for _, env in t.reports.owed] == ["e1", "e3"]
    t.reports.flush()  # still refused: still owed, nothing sent twice
    assert inbox_events(log, "j1") == ["e0", "e2"] and len(t.reports.owed) == 2
    world.advance(REFUSED_FOR_MS)
    t.reports.flush()
    assert not t.reports.owed
    dead = [f for _, f in log.replay_raw(log.keys.dead(log.keys.job("bad")))]
    assert [f[b"kind"] for f in dead] == [b"undeliverable"] * 2
    assert all(b"refused the report for 30 s" in f[b"reason"] and f[b"stream"].decode() == bad for f in dead)
    assert [decode(f[b"field:e"]).event.execution_id for f in dead] == ["e1", "e3"]  # in order


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
    pump(
        steps, lambda: job_state(log, "j1").status.value == "FINISHED", what="the job's end", world=world, advance_ms=10
    )
    t.step(block_ms=None)
    group = t.inbox.consumer.group
    state = log.backend.group_state(t.inbox.stream, group)
    assert state is not None and state.pending == 0
