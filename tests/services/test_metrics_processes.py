"""The metrics of a real JobManager and TaskManager, stepped in this process on the test's
Redis: what their registries say agrees with the log (task states, restarts, split round
trips, leadership recovered), and the gauges read from Redis at scrape time (inbox lag
and pending entries, dead letters) follow the inboxes."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from sluice.events import (
    Envelope,
    NextInputSplit,
    RequestNextInputSplit,
    TaskManagerHeartbeat,
    TaskRestartScheduled,
    TaskState,
    UpdateTaskExecutionState,
)
from sluice.events.descriptor import descriptor_from_json
from sluice.services.jobmanager import JobManager
from sluice.services.taskmanager.core import RegistrationConfig
from sluice.services.taskmanager.process import TaskManager
from sluice.services.taskmanager.worker import report_state
from sluice.store import EventLog
from tests.services.failover_helpers import (
    ManualWorld,
    TinySlots,
    events,
    lead,
    pump,
    register_tm,
    report,
    source_graph,
    submit,
)
from tests.services.test_metrics import value


def processes(log: EventLog, tmp_path: Path) -> tuple[JobManager, TaskManager, TinySlots, ManualWorld]:
    world = ManualWorld()
    jm = JobManager(
        log, world=world, jm_id="jm-1", storage_root=f"file://{tmp_path}/storage", checkpoint_interval_ms=600_000
    )
    slots = TinySlots(log)
    tm = TaskManager(
        log,
        resource_id="tm-1",
        slots=2,
        host="host-a",
        world=world,
        runner=slots,
        home=tmp_path / "tm-1",
        config=RegistrationConfig(50, 400, 100, 600_000),
    )
    return jm, tm, slots, world


def test_the_leaders_counters_agree_with_the_log(log: EventLog, tmp_path: Path) -> None:
    jm, tm, slots, world = processes(log, tmp_path)
    assert value(jm.metrics.registry, "sluice_jobmanager_leading") == 0
    lead(jm, world)
    assert value(jm.metrics.registry, "sluice_leadership_recovery_seconds_count") == 1
    register_tm(jm, tm, world)
    steps = [lambda: jm.step(block_ms=None), lambda: tm.step(block_ms=None)]
    submit(log, world, "j1", source_graph("j1", parallelism=1, splits=2))
    pump(steps, lambda: len(slots.launched) == 1, what="the deployment", world=world, advance_ms=10)
    d = slots.launched[0][1]
    report(log, world, d, "tm-1", 0, TaskState.RUNNING)
    jm_reg, tm_reg = jm.metrics.registry, tm.metrics.registry
    pump(steps, lambda: value(jm_reg, "sluice_tasks", state="RUNNING") == 1, what="the task running", world=world)
    assert value(jm_reg, "sluice_cluster_slots", state="in_use") == 1
    assert value(jm_reg, "sluice_cluster_slots", state="free") == 1
    assert value(tm_reg, "sluice_taskmanager_slots", state="in_use") == 1
    assert value(tm_reg, "sluice_taskmanager_tasks", state="RUNNING") == 1

    # A split request sent, the leader answers 40 ms later (by the test's clock).
    job_inbox = log.keys.inbox(log.keys.job("j1"))
    log.append(
        job_inbox,
        Envelope(
            RequestNextInputSplit("j1", "src", 0, d["execution_id"], "host-a", 1),
            world.new_id(),
            0,
            world.now_ms(),
            "j1",
        ),
    )
    world.advance(40)
    facts = log.keys.facts(log.keys.job("j1"))
    pump(steps, lambda: events(log, facts, NextInputSplit), what="the answer", world=world)
    assert value(jm_reg, "sluice_split_round_trip_seconds_count") == 1
    assert value(jm_reg, "sluice_split_round_trip_seconds_sum") == 0.04

    # It fails: restarted (no delay), then its next attempt finishes.
    report_state(log, world, descriptor_from_json(d), "tm-1", 0, TaskState.FAILED, error="boom")
    pump(steps, lambda: len(slots.launched) == 2, what="the restart", world=world, advance_ms=10)
    slot, again, _ = slots.launched[1]
    report(log, world, again, "tm-1", slot, TaskState.RUNNING)
    report(log, world, again, "tm-1", slot, TaskState.FINISHED)
    pump(
        steps,
        lambda: value(jm_reg, "sluice_task_transitions_total", state="FINISHED") == 1 and not tm.tasks,
        what="the job's end",
        world=world,
        advance_ms=10,
    )
    states = [f.state.value for f in events(log, facts, UpdateTaskExecutionState)]
    for state in set(states):
        assert value(jm_reg, "sluice_task_transitions_total", state=state) == states.count(state), state
    assert value(jm_reg, "sluice_task_restarts_total") == len(events(log, facts, TaskRestartScheduled)) == 1
    assert value(jm_reg, "sluice_events_appended_total", type="UpdateTaskExecutionState", stream="facts") == len(states)
    assert value(tm_reg, "sluice_taskmanager_tasks_ended_total", state="FAILED") == 1
    assert value(tm_reg, "sluice_taskmanager_tasks_ended_total", state="FINISHED") == 1
    assert value(tm_reg, "sluice_taskmanager_slots", state="free") == 2
    assert value(jm_reg, "sluice_cluster_slots", state="free") == 2
    sent = events(log, log.keys.inbox(log.keys.job("j1")), UpdateTaskExecutionState)
    initializing = [ev for ev in sent if ev.state == TaskState.INITIALIZING]  # the TaskManager's own
    assert (
        value(tm_reg, "sluice_events_appended_total", type="UpdateTaskExecutionState", stream="inbox")
        == len(initializing)
        == 2
    )


def test_inbox_lag_pending_and_dead_letters_are_read_from_redis_when_scraped(log: EventLog, tmp_path: Path) -> None:
    jm, tm, _, world = processes(log, tmp_path)
    lead(jm, world)
    register_tm(jm, tm, world)
    jm.step(block_ms=None)
    reg = jm.metrics.registry
    assert value(reg, "sluice_inbox_lag_entries", inbox="cluster") == 0
    assert value(reg, "sluice_inbox_pending_entries", inbox="cluster") == 0
    inbox = log.keys.inbox(log.keys.cluster)
    beat: Any = TaskManagerHeartbeat("tm-1", tm.reg.session, jm.epoch or 0, 0)
    for _ in range(3):
        log.append(inbox, Envelope(beat, world.new_id(), 0, world.now_ms()))
    log.append_raw(inbox, {b"e": b"{not an envelope"})
    assert value(reg, "sluice_inbox_lag_entries", inbox="cluster") == 4  # nobody read them yet
    read = jm.consumer.read(count=2, block_ms=None)  # read, not yet decided: pending
    assert len(read) == 2
    assert value(reg, "sluice_inbox_lag_entries", inbox="cluster") == 2
    assert value(reg, "sluice_inbox_pending_entries", inbox="cluster") == 2
    jm.handle_batch(read)
    for _ in range(3):
        jm.step(block_ms=None)
    assert value(reg, "sluice_inbox_lag_entries", inbox="cluster") == 0
    assert value(reg, "sluice_inbox_pending_entries", inbox="cluster") == 0
    assert value(reg, "sluice_dead_letters_parked_total", kind="not JSON") == 1
    assert value(reg, "sluice_dead_letter_entries", scope="cluster") == 1
    assert value(reg, "sluice_events_handled_total", type="TaskManagerHeartbeat") >= 3
    # The TaskManager's own inbox, as its endpoint sees it.
    tm_inbox = log.keys.inbox(log.keys.taskmanager("tm-1"))
    log.append_raw(tm_inbox, {b"e": b"[]"})
    assert value(tm.metrics.registry, "sluice_inbox_lag_entries", inbox="taskmanager") >= 1
    tm.step(block_ms=None)
    assert value(tm.metrics.registry, "sluice_inbox_lag_entries", inbox="taskmanager") == 0
    assert value(tm.metrics.registry, "sluice_dead_letter_entries", scope="taskmanager") == 1
    assert value(tm.metrics.registry, "sluice_dead_letters_parked_total", kind="malformed envelope") == 1


def test_a_scrape_while_redis_is_away_still_serves_what_the_process_holds(tmp_path: Path) -> None:
    from sluice.store import Keys, connect

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"redis://127.0.0.1:{s.getsockname()[1]}/0"
    away = EventLog(connect(url, check=False, timeout=0.5), Keys("away"))
    jm = JobManager(away, world=ManualWorld(), jm_id="jm-away")
    reg = jm.metrics.registry
    assert value(reg, "sluice_jobmanager_leading") == 0
    assert value(reg, "sluice_cluster_slots", state="free") == 0
    assert value(reg, "sluice_inbox_lag_entries", inbox="cluster") is None  # not read: not made up
