"""sluice replay's logic (sluice.views.replay) on the session's real redis-server, over the
log of a job a real JobManager and TaskManager ran (driven through their step functions),
with a failure and a restart."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from sluice.errors import SluiceError
from sluice.events import TaskState
from sluice.events.descriptor import descriptor_from_json
from sluice.services.projector import Projector
from sluice.services.taskmanager.worker import report_state
from sluice.store import EventLog, Keys, ReadModels
from sluice.views.archive import PrefixInUse
from sluice.views.history import Moment, resolve_at
from sluice.views.replay import Difference, check, rebuild, rebuild_json, write_into
from tests.services.failover_helpers import (
    ManualWorld,
    TinySlots,
    jm,
    job_state,
    lead,
    pump,
    register_tm,
    report,
    source_graph,
    submit,
    tm,
)

ERROR = 'Traceback (most recent call last):\n  File "job.py", line 3, in tokenize\nValueError: boom'


@dataclass
class Run:
    log: EventLog
    world: ManualWorld
    slots: TinySlots
    steps: list
    job_id: str
    mid: str = ""
    """The job's last fact while it ran its first attempts (before the failure)."""

    def finish(self) -> None:
        """The restarted attempt runs and finishes, then the other subtask; until the job ends."""
        log, world, slots = self.log, self.world, self.slots
        slot, d, _ = slots.launched[2]
        report(log, world, d, "tm-1", slot, TaskState.RUNNING)
        report(log, world, d, "tm-1", slot, TaskState.FINISHED)
        slot, d, _ = slots.launched[1]
        report(log, world, d, "tm-1", slot, TaskState.FINISHED)
        pump(
            self.steps,
            lambda: job_state(log, self.job_id).ended_at is not None,
            what="the job's end",
            world=world,
            advance_ms=10,
        )


def run_with_a_restart(log: EventLog, tmp_path: Path, job_id: str = "j1", *, finish: bool = True) -> Run:
    """Job ``job_id`` (two source subtasks) runs on one TaskManager; subtask 0's first
    attempt fails and runs again; then (``finish``) every subtask finishes."""
    world = ManualWorld()
    a = jm(log, world, "jm-a", tmp_path)
    lead(a, world)
    slots = TinySlots()
    t = tm(log, world, tmp_path, slots, n=2)
    register_tm(a, t, world)
    run = Run(log, world, slots, [a.step, t.step], job_id)
    submit(log, world, job_id, source_graph(job_id, parallelism=2))
    pump(run.steps, lambda: len(slots.launched) == 2, what="two launches", world=world, advance_ms=10)
    for slot, d, _ in slots.launched:
        report(log, world, d, "tm-1", slot, TaskState.RUNNING)

    def running() -> bool:
        job = job_state(log, job_id)
        return job.status.value == "RUNNING" and all(
            ex.state is TaskState.RUNNING for v in job.vertices.values() for ex in v.subtasks
        )

    pump(run.steps, running, what="both subtasks running", world=world, advance_ms=10)
    run.mid = log.last_id(log.keys.facts(log.keys.job(job_id))) or ""
    slot, d, _ = slots.launched[0]
    report_state(log, world, descriptor_from_json(d), "tm-1", slot, TaskState.FAILED, error=ERROR)
    pump(run.steps, lambda: len(slots.launched) == 3, what="the restarted attempt's launch", world=world, advance_ms=10)
    if finish:
        run.finish()
    return run


@contextmanager
def second_prefix(log: EventLog) -> Iterator[EventLog]:
    """A log under a second, fresh prefix of the same server (its keys removed after)."""
    target = EventLog(log.backend, Keys("t" + uuid.uuid4().hex[:10]))
    try:
        yield target
    finally:
        client = log.client
        for key in client.scan_iter(match=target.keys.pattern, count=1000):
            client.delete(key)


@pytest.fixture
def other(log: EventLog) -> Iterator[EventLog]:
    with second_prefix(log) as target:
        yield target


@pytest.mark.timeout(90)
def test_until_the_middle_of_the_job_shows_it_running_with_the_attempts_it_had_then(
    log: EventLog, tmp_path: Path
) -> None:
    run = run_with_a_restart(log, tmp_path)
    then = rebuild_json(log, rebuild(log, resolve_at(run.mid)))
    job = then["jobs"]["j1"]["tables"]["executiongraph"]
    assert then["jobs"]["j1"]["position"] == run.mid
    assert job["job"]["status"] == "RUNNING" and job["job"]["restarts"] == 0
    assert {k: (r["attempt"], r["state"]) for k, r in job.items() if k != "job"} == {
        "src/0": (0, "RUNNING"),
        "src/1": (0, "RUNNING"),
    }
    assert set(then["cluster"]["tables"]["taskmanagers"]) == {"tm-1"}
    assert then["cluster"]["tables"]["leadership"]["leader"]["leader_id"] == "jm-a"
    now = rebuild_json(log, rebuild(log, Moment(None), job="j1"))
    assert "cluster" not in now
    graph = now["jobs"]["j1"]["tables"]["executiongraph"]
    assert graph["job"]["status"] == "FINISHED" and graph["job"]["restarts"] == 1
    assert graph["src/0"]["attempt"] > 0 and graph["src/0"]["state"] == "FINISHED"
    only = rebuild_json(log, rebuild(log, Moment(None), cluster=True))
    assert only["jobs"] == {} and set(only["cluster"]["tables"]["jobs"]) == {"j1"}


@pytest.mark.timeout(90)
def test_into_a_fresh_prefix_writes_the_tables_and_the_facts_up_to_the_moment(
    log: EventLog, other: EventLog, tmp_path: Path
) -> None:
    run = run_with_a_restart(log, tmp_path)
    built = rebuild(log, resolve_at(run.mid))
    copied = write_into(log, other, built)
    assert copied[other.keys.facts(other.keys.job("j1"))] == len(
        list(log.replay_raw(log.keys.facts(log.keys.job("j1")), page=10_000))
    ) - sum(1 for _ in log.replay_raw(log.keys.facts(log.keys.job("j1")), run.mid))
    assert other.last_id(other.keys.facts(other.keys.job("j1"))) == run.mid
    stored = ReadModels(other)
    for (tag, name), rows in built.tables(other).items():
        position, got = stored.read(tag, name)
        assert got == rows
        assert position == (run.mid if tag == other.keys.job("j1") else built.cluster.last_entry)  # type: ignore[union-attr]
    assert stored.read(other.keys.job("j1"), "executiongraph")[1]["job"]["status"] == "RUNNING"
    # A projector there finds nothing to do, and the tables agree with their log.
    assert Projector(other).catch_up() == 0
    result = check(other)
    assert result.agree and all(t.lag == 0 for t in result.tables)
    with pytest.raises(PrefixInUse, match=rf"prefix '{other.keys.prefix}' is not empty: it holds .*--into"):
        write_into(log, other, built)


@pytest.mark.timeout(90)
def test_check_reports_a_lagging_projector_as_lag_and_a_wrong_row_field_by_field(log: EventLog, tmp_path: Path) -> None:
    run = run_with_a_restart(log, tmp_path, finish=False)
    projector = Projector(log)
    projector.catch_up()
    projector.catch_up()  # (the job's tables join once the jobs table names it)
    first = check(log)
    assert first.agree and {t.table: t.lag for t in first.tables}["executiongraph"] == 0
    assert {(t.scope, t.table) for t in first.tables} == {
        ("cluster", "taskmanagers"),
        ("cluster", "leadership"),
        ("cluster", "jobs"),
        ("job j1", "executiongraph"),
        ("job j1", "kvstate"),
    }
    # More facts than the projector has seen: lag, not a difference.
    before = log.last_id(log.keys.facts(log.keys.job("j1")))
    run.finish()
    lagging = check(log, job="j1")
    eg = next(t for t in lagging.tables if t.table == "executiongraph")
    assert lagging.agree and eg.lag > 0 and eg.position == before and eg.log_end != before
    assert [t.scope for t in lagging.tables] == ["job j1", "job j1"]
    # A row the projector got wrong: named by table, key and field.
    position, rows = ReadModels(log).read(log.keys.job("j1"), "executiongraph")
    assert position is not None
    wrong = dict(rows["src/1"], state="CANCELED")
    ReadModels(log).write(
        log.keys.job("j1"),
        "executiongraph",
        expected=position,
        position=position,
        rows={"src/1": wrong, "ghost/0": {"vertex": "ghost"}},
    )
    differs = check(log, job="j1")
    assert not differs.agree
    assert differs.differences == [
        Difference("job j1", "executiongraph", "ghost/0", "*", {"vertex": "ghost"}, None),
        Difference("job j1", "executiongraph", "src/1", "state", "CANCELED", rows["src/1"]["state"]),
    ]
    assert differs.to_json()["differences"][1] == {
        "scope": "job j1",
        "table": "executiongraph",
        "key": "src/1",
        "field": "state",
        "live": "CANCELED",
        "rebuilt": rows["src/1"]["state"],
    }


def test_check_and_rebuild_of_a_job_the_log_never_had_say_so(log: EventLog) -> None:
    with pytest.raises(SluiceError, match="job 'nope' not found"):
        check(log, job="nope")
    with pytest.raises(SluiceError, match="job 'nope' not found"):
        rebuild(log, Moment(None), job="nope")
