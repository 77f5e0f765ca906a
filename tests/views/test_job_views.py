"""The job views (jobs, timeline, graph, TaskManagers) on a log made by a real JobManager
and TaskManager, driven through their step functions on the session's redis-server: one
job whose subtask fails (a traceback), is restarted and finishes; and the same views at an
entry in the middle of it (time travel)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from sluice.errors import JobNotFound
from sluice.events import (
    Envelope,
    JobGraph,
    NextInputSplit,
    RequestNextInputSplit,
    RestartStrategy,
    TaskState,
)
from sluice.events.descriptor import descriptor_from_json
from sluice.services.projector import Projector
from sluice.services.taskmanager.worker import report_state
from sluice.store import EventLog, ReadModels
from sluice.views.graph import graph, to_dot
from sluice.views.history import Moment, resolve_at
from sluice.views.jobs import jobs
from sluice.views.taskmanagers import taskmanagers
from sluice.views.timeline import timeline
from tests.services.failover_helpers import (
    ManualWorld,
    TinySlots,
    events,
    jm,
    job_state,
    keyed_graph,
    lead,
    pump,
    register_tm,
    report,
    source_graph,
    submit,
    tm,
)

TRACEBACK = (
    'Traceback (most recent call last):\n  File "job.py", line 3, in tokenize\n'
    '    raise ValueError("boom")\nValueError: boom'
)


@dataclass
class Run:
    """What ``run_failing_job`` made: the job ``j1`` (and ``j2``, built and never run)."""

    mid: str
    """A fact entry of j1 after the restart was scheduled, before the job finished."""
    failed_split: int
    """The split attempt 0 of src[0] held when it failed."""


def ask_split(log: EventLog, world: ManualWorld, d: dict, seq: int) -> None:
    log.append(
        log.keys.inbox(log.keys.job(d["job_id"])),
        Envelope(
            RequestNextInputSplit(d["job_id"], d["vertex"], d["subtask"], d["execution_id"], "host-a", seq),
            world.new_id(),
            0,
            world.now_ms(),
            d["job_id"],
        ),
    )


def run_failing_job(log: EventLog, tmp_path: Path) -> Run:
    """j1: src x2 reading 4 splits; src[0] takes a split, fails with a traceback, is
    restarted as attempt 1, which reads every split left; both finish. j2 (src -> keyed
    agg) is submitted and left waiting for a slot."""
    world = ManualWorld()
    a = jm(log, world, "jm-a", tmp_path)
    lead(a, world)
    slots = TinySlots()
    t = tm(log, world, tmp_path, slots, n=2)
    register_tm(a, t, world)
    steps = [a.step, t.step]
    submit(log, world, "j1", source_graph("j1", parallelism=2))
    pump(steps, lambda: len(slots.launched) == 2, what="two launches", world=world, advance_ms=10)
    first = {d["subtask"]: (slot, d) for slot, d, _ in slots.launched}
    for slot, d in first.values():
        report(log, world, d, "tm-1", slot, TaskState.RUNNING)
    slot0, d0 = first[0]
    facts = log.keys.facts(log.keys.job("j1"))
    ask_split(log, world, d0, 1)
    pump(
        steps, lambda: len(events(log, facts, NextInputSplit)) == 1, what="the first split", world=world, advance_ms=10
    )
    failed_split = events(log, facts, NextInputSplit)[0].split["index"]
    report_state(log, world, descriptor_from_json(d0), "tm-1", slot0, TaskState.FAILED, error=TRACEBACK)
    pump(steps, lambda: len(slots.launched) == 3, what="the restarted attempt", world=world, advance_ms=10)
    mid = log.last_id(facts)
    assert mid is not None
    slot1, d1, _ = slots.launched[2]
    assert d1["attempt"] == 1
    report(log, world, d1, "tm-1", slot1, TaskState.RUNNING)
    # src[1] ends without a split (as if the other reader had taken them all): nothing is
    # kept for it any more (a reader that has not asked yet keeps its share)
    report(log, world, first[1][1], "tm-1", first[1][0], TaskState.FINISHED)
    pump(
        steps,
        lambda: job_state(log, "j1").vertices["src"].finished == 1,
        what="src[1]'s end",
        world=world,
        advance_ms=10,
    )
    for seq in range(1, 6):  # 4 splits: attempt 1 reads them all, then hears there are no more
        ask_split(log, world, d1, seq)
        pump(
            steps,
            lambda n=seq: len(events(log, facts, NextInputSplit)) == 1 + n,
            what=f"answer {seq}",
            world=world,
            advance_ms=10,
        )
    report(log, world, d1, "tm-1", slot1, TaskState.FINISHED)
    pump(steps, lambda: job_state(log, "j1").ended_at is not None, what="the job's end", world=world, advance_ms=10)
    submit(log, world, "j2", keyed_graph("j2"))
    pump(
        steps,
        lambda: log.last_id(log.keys.facts(log.keys.job("j2"))) is not None and job_state(log, "j2").built,
        what="j2's graph",
        world=world,
        advance_ms=10,
    )
    return Run(mid, failed_split)


@pytest.fixture
def ran(log: EventLog, tmp_path: Path) -> Run:
    return run_failing_job(log, tmp_path)


@pytest.mark.timeout(90)
def test_the_views_tell_a_failure_a_restart_and_the_end(log: EventLog, ran: Run) -> None:
    rows = {r["job_id"]: r for r in jobs(log)}
    assert set(rows) == {"j1", "j2"}
    j1 = rows["j1"]
    assert (j1["status"], j1["tasks_done"], j1["tasks_total"], j1["restarts"]) == ("FINISHED", 2, 2, 1)
    assert j1["ended_at"] >= j1["submitted_at"] and j1["duration_s"] >= 0
    assert (rows["j2"]["status"], rows["j2"]["tasks_done"], rows["j2"]["tasks_total"]) == ("CREATED", 0, 2)

    t = timeline(log, "j1")
    assert t["job"] == j1 and t["restarts"] == 1
    assert t["entries"] == [i for i, _ in log.replay(log.keys.facts(log.keys.job("j1")))]
    assert [e["entry"] for e in t["events"]] == t["entries"]
    kinds = [e["kind"] for e in t["events"]]
    for kind in (
        "submitted",
        "graph-built",
        "state",
        "split-request",
        "split",
        "no-more-splits",
        "restart",
        "job-status",
    ):
        assert kind in kinds, kind
    assert (
        kinds[0] == "submitted" and [e["text"] for e in t["events"] if e["kind"] == "job-status"][-1] == "job FINISHED"
    )
    restart = next(e for e in t["events"] if e["kind"] == "restart")
    assert (restart["vertex"], restart["subtask"], restart["attempt"]) == ("src", 0, 1)
    cause = t["root_cause"]
    assert cause["job_failed"] is False and cause["attempt"] == "src:0:0"
    assert cause["text"] == "src[0] attempt 0 failed: ValueError: boom" and cause["traceback"] == TRACEBACK
    attempts = {(a["vertex"], a["subtask"], a["attempt"]): a for a in t["attempts"]}
    assert set(attempts) == {("src", 0, 0), ("src", 0, 1), ("src", 1, 0)}
    a0, a1 = attempts[("src", 0, 0)], attempts[("src", 0, 1)]
    assert [s["state"] for s in a0["states"]] == [
        "CREATED",
        "SCHEDULED",
        "DEPLOYING",
        "INITIALIZING",
        "RUNNING",
        "FAILED",
    ]
    assert a0["final"] == "FAILED" and a0["error"] == TRACEBACK and a0["taskmanager"] == "tm-1"
    assert a0["ended_at"] >= a0["started_at"] and a0["duration_s"] is not None
    assert all(s["duration_s"] is not None for s in a0["states"][:-1])
    assert a0["splits"] == [
        {"split": ran.failed_split, "what": a0["splits"][0]["what"], "at": a0["splits"][0]["at"], "outcome": "returned"}
    ]
    assert sorted(s["split"] for s in a1["splits"]) == [0, 1, 2, 3]
    assert {s["outcome"] for s in a1["splits"]} == {"finished"} and a1["final"] == "FINISHED"

    g = graph(log, "j1")
    assert g["vertices"] == [
        {
            "id": "src",
            "name": "src",
            "kind": "source",
            "parallelism": 2,
            "states": {"FINISHED": 2},
            "status": "FINISHED",
        }
    ]
    assert g["edges"] == [] and g["status"] == "FINISHED"
    g2 = graph(log, "j2")
    assert g2["edges"] == [{"source": "src", "target": "agg", "exchange": "keyed", "key": "id"}]
    dot = to_dot(g2)
    assert '"src" -> "agg" [label="keyed by id", style=dashed];' in dot and dot.startswith('digraph "j2"')

    (row,) = taskmanagers(log)
    assert (row["resource_id"], row["host"], row["state"], row["slots_total"]) == ("tm-1", "host-a", "REGISTERED", 2)
    assert row["last_heartbeat"] is not None and row["registered_at"] is not None
    # j2 waits for its first subtask's slot or holds one; j1 holds none any more.
    assert all(h["job_id"] == "j2" for h in row["slots"])
    assert row["slots_in_use"] + row["slots_free"] == 2


@pytest.mark.timeout(90)
def test_at_an_earlier_entry_the_views_show_the_job_running(log: EventLog, ran: Run) -> None:
    at = resolve_at(ran.mid)
    t = timeline(log, "j1", at)
    assert t["job"]["status"] == "RUNNING" and t["job"]["ended_at"] is None and t["restarts"] == 1
    assert t["entries"][-1] == ran.mid and len(t["entries"]) < len(timeline(log, "j1")["entries"])
    attempts = {(a["vertex"], a["subtask"], a["attempt"]): a for a in t["attempts"]}
    assert attempts[("src", 0, 0)]["final"] == "FAILED"
    assert attempts[("src", 0, 1)]["final"] in ("CREATED", "SCHEDULED", "DEPLOYING")
    assert attempts[("src", 1, 0)]["final"] == "RUNNING" and attempts[("src", 1, 0)]["ended_at"] is None
    assert "job FINISHED" not in [e["text"] for e in t["events"]] and t["root_cause"]["attempt"] == "src:0:0"
    (row,) = [r for r in jobs(log, at) if r["job_id"] == "j1"]
    assert (row["status"], row["tasks_done"], row["restarts"]) == ("RUNNING", 0, 1)
    assert "j2" not in {r["job_id"] for r in jobs(log, at)}  # not registered yet then
    g = graph(log, "j1", at)
    assert g["vertices"][0]["states"].get("RUNNING") == 1 and g["vertices"][0]["status"] != "FINISHED"
    (tmrow,) = taskmanagers(log, at)
    assert any(h["execution_id"] == "src:1:0" for h in tmrow["slots"]) and tmrow["slots_in_use"] >= 1
    # Before anything: no job registered yet.
    assert jobs(log, Moment("0-1")) == []


def test_an_unknown_job_is_named_with_where_to_look(log: EventLog) -> None:
    for view in (timeline, graph):
        with pytest.raises(JobNotFound, match="job 'nope' not found under prefix .*sluice list"):
            view(log, "nope")
    with pytest.raises(JobNotFound, match="job 'a b' not found"):
        graph(log, "a b")


@pytest.mark.timeout(90)
def test_now_the_lists_read_up_to_date_projected_rows_instead_of_folding(log: EventLog, ran: Run) -> None:
    folded, tms = jobs(log), taskmanagers(log)
    Projector(log).catch_up()
    Projector(log).catch_up()  # the job tables come after the cluster's jobs table names the job
    projected = jobs(log)
    assert taskmanagers(log) == tms and tms[0]["slots"] == [
        {"slot": tms[0]["slots"][0]["slot"], "job_id": "j2", "execution_id": "src:0:0"}
    ]

    def steady(rows: list[dict]) -> list[dict]:
        return [{k: v for k, v in r.items() if r["ended_at"] is not None or k != "duration_s"} for r in rows]

    assert steady(projected) == steady(folded)
    # Read from the row: a row the projector wrote (here, a wrong one) is what the list shows...
    tag = log.keys.job("j1")
    position, rows = ReadModels(log).read(tag, "executiongraph")
    ReadModels(log).write(
        tag,
        "executiongraph",
        expected=position,
        position=position or "",
        rows={
            "job": dict(rows["job"], restarts=7),
            "src/1": dict(rows["src/1"], state="RUNNING", taskmanager="tm-1", slot=1),
        },
    )
    assert [r["restarts"] for r in jobs(log) if r["job_id"] == "j1"] == [7]
    assert {"slot": 1, "job_id": "j1", "execution_id": "src:1:0"} in taskmanagers(log)[0]["slots"]
    # ...while it is up to date; once the job has a newer fact, its log is folded again.
    log.append(
        log.keys.facts(tag), Envelope(NextInputSplit("j1", "src:0:0", None), "x", 1, 1, "j1")
    )  # (folds as nothing)
    assert [r["restarts"] for r in jobs(log) if r["job_id"] == "j1"] == [1]
    assert taskmanagers(log) == tms
    # In the past, always the fold.
    assert [r["restarts"] for r in jobs(log, resolve_at(ran.mid)) if r["job_id"] == "j1"] == [1]


@pytest.mark.timeout(60)
def test_a_job_that_fails_without_restart_has_its_root_cause_with_the_traceback(log: EventLog, tmp_path: Path) -> None:
    world = ManualWorld()
    a = jm(log, world, "jm-a", tmp_path)
    lead(a, world)
    slots = TinySlots()
    t = tm(log, world, tmp_path, slots, n=1)
    register_tm(a, t, world)
    g = source_graph("j3")
    submit(log, world, "j3", JobGraph(g.name, g.vertices, g.edges, g.max_parallelism, RestartStrategy("none")))
    pump([a.step, t.step], lambda: len(slots.launched) == 1, what="the launch", world=world, advance_ms=10)
    slot, d, _ = slots.launched[0]
    report(log, world, d, "tm-1", slot, TaskState.RUNNING)
    report_state(log, world, descriptor_from_json(d), "tm-1", slot, TaskState.FAILED, error=TRACEBACK)
    pump(
        [a.step, t.step],
        lambda: job_state(log, "j3").ended_at is not None,
        what="the job's end",
        world=world,
        advance_ms=10,
    )
    tl = timeline(log, "j3")
    assert tl["job"]["status"] == "FAILED" and tl["restarts"] == 0
    assert tl["root_cause"] == {
        "text": "task src[0] failed (restart strategy: none): ValueError: boom",
        "traceback": TRACEBACK,
        "attempt": "src:0:0",
        "at": tl["job"]["ended_at"],
        "job_failed": True,
    }
    (row,) = jobs(log)
    assert row["status"] == "FAILED" and TRACEBACK in row["reason"] and row["tasks_done"] == 0
