"""Time travel (sluice.views.history) on the session's real redis-server, with a real
JobManager and TaskManager driven through their step functions."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.errors import SluiceError
from sluice.events import TaskState
from sluice.services.jobs.state import JobsState, evolve
from sluice.services.projector import Projector
from sluice.store import EventLog, ReadModels
from sluice.views.history import BadMoment, Moment, cluster_at, job_at, resolve_at, tables
from tests.services.failover_helpers import (
    ManualWorld,
    TinySlots,
    job_state,
    pump,
    report,
    source_graph,
    started,
    submit,
)


def test_at_accepts_entry_ids_milliseconds_and_iso_times() -> None:
    assert resolve_at(None) == Moment(None)
    assert resolve_at("now").entry is None
    assert resolve_at("1763870000000-3").entry == "1763870000000-3"
    assert resolve_at("1763870000000").includes("1763870000000-99")
    assert not resolve_at("1763870000000").includes("1763870000001-0")
    assert resolve_at("2025-11-23T04:33:20Z").entry == resolve_at("1763872400000").entry
    assert resolve_at("2025-11-23T05:33:20+01:00").entry == resolve_at("1763872400000").entry
    assert resolve_at("2025-11-23T04:33:20").entry == resolve_at("1763872400000").entry  # naive: UTC


@pytest.mark.parametrize("bad", ["yesterday", "12-ab", "2026-13-40"])
def test_a_moment_that_is_not_one_says_which_forms_are(bad: str) -> None:
    with pytest.raises(BadMoment, match="entry id.*milliseconds.*ISO 8601"):
        resolve_at(bad)


def run_a_job(log: EventLog, tmp_path: Path) -> tuple[ManualWorld, TinySlots]:
    world, a, t, slots = started(log, tmp_path)
    submit(log, world, "j1", source_graph("j1", parallelism=2))
    pump([a.step, t.step], lambda: len(slots.launched) == 2, what="two launches", world=world, advance_ms=10)
    for slot, d, _ in slots.launched:
        report(log, world, d, "tm-1", slot, TaskState.RUNNING)
        report(log, world, d, "tm-1", slot, TaskState.FINISHED)
    pump(
        [a.step, t.step],
        lambda: job_state(log, "j1").ended_at is not None,
        what="the job's end",
        world=world,
        advance_ms=10,
    )
    return world, slots


@pytest.mark.timeout(60)
def test_the_state_at_every_entry_is_the_fold_of_the_facts_up_to_it(log: EventLog, tmp_path: Path) -> None:
    run_a_job(log, tmp_path)
    stream = log.keys.facts(log.keys.job("j1"))
    facts = list(log.replay(stream))
    assert len(facts) > 10
    states_seen = set()
    for k in (0, 1, len(facts) // 3, len(facts) // 2, len(facts) - 1):
        entry_id = facts[k][0]
        want = JobsState()
        for _, env in facts[: k + 1]:
            evolve(want, env)
        got = job_at(log, "j1", resolve_at(entry_id))
        assert got.facts == k + 1 and got.last_entry == entry_id
        assert tables(log, jobs=[got]) == tables(log, jobs=[_wrap(want)])
        if got.run is not None:
            states_seen.add(tuple(sorted(ex.state.value for v in got.run.vertices.values() for ex in v.subtasks)))
    assert len(states_seen) >= 2  # the moments really differ
    # Before the first fact: nothing yet; a time before the job: the same.
    first_ms = int(facts[0][0].split("-")[0])
    assert job_at(log, "j1", resolve_at(str(first_ms - 1))).run is None


def _wrap(state: JobsState):
    from sluice.views.history import JobAt

    j = JobAt("j1")
    j.graph = state
    return j


@pytest.mark.timeout(60)
def test_now_is_the_projectors_tables(log: EventLog, tmp_path: Path) -> None:
    run_a_job(log, tmp_path)
    Projector(log).catch_up()
    Projector(log).catch_up()  # the job tables are added after the cluster's jobs table names the job
    now = tables(log, cluster_at(log), [job_at(log, "j1")])
    read = ReadModels(log)
    stored = {key: read.read(*key)[1] for key in now}
    assert now == stored
    assert set(now[(log.keys.cluster, "taskmanagers")]) == {"tm-1"}
    assert now[(log.keys.job("j1"), "executiongraph")]["job"]["status"] == "FINISHED"


def test_a_job_the_log_never_had_is_not_found(log: EventLog) -> None:
    with pytest.raises(SluiceError, match="job 'nope' not found.*sluice list"):
        job_at(log, "nope")
