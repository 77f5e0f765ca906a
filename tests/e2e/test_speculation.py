"""Speculative execution on a real cluster (two TaskManagers, real Spark): a reducer subtask
straggles; the leader starts a speculative attempt of it on the other TaskManager, which
wins; the straggler is cancelled; the output is exactly plain PySpark's."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import functions as F

from sluice.events import (
    AttemptWon,
    JobStatus,
    SpeculativeAttemptScheduled,
    TaskState,
    UpdateTaskExecutionState,
)
from sluice.services.projector import Projector
from sluice.store import EventLog
from sluice.views.replay import check
from sluice.views.timeline import timeline
from tests.e2e.conftest import MARGIN, SLACK, SPARK_START, TEARDOWN, Processes, registered, start_tm, wait_until
from tests.e2e.test_jobs import JOBS, job_facts, run_job, write_lines


@pytest.fixture
def cluster(procs: Processes, log: EventLog, spark_remote: str, tmp_path: Path):
    home = tmp_path / "home"
    procs.start(
        "jm",
        "jobmanager",
        "--storage-root",
        (tmp_path / "storage").as_uri(),
        "--speculation",
        "1.5,0",
        env={"SLUICE_HOME": str(home), **SLACK},
    )
    return {"home": home, "spark": spark_remote}


@pytest.mark.slow  # a minute: two TaskManagers, two Spark jobs per subtask
@pytest.mark.timeout(SPARK_START + 90 + 240 + MARGIN + TEARDOWN)
def test_a_straggler_races_a_speculative_attempt_on_another_taskmanager_and_the_output_is_exact(
    procs: Processes, log: EventLog, cluster: dict, spark, tmp_path: Path
) -> None:
    start_tm(procs, cluster, "tm-1", slots=3)
    start_tm(procs, cluster, "tm-2", slots=3)
    wait_until(lambda: registered(log) == {"tm-1", "tm-2"}, "the TaskManagers", timeout=90)
    text = write_lines(tmp_path / "in.txt")
    out = tmp_path / "out"
    job_id, job = run_job(log, JOBS / "straggler.py", {"input": str(text), "output": str(out)}, timeout=240)
    assert job.status == JobStatus.FINISHED, job.reason
    facts = job_facts(log, job_id)
    (spec,) = [f for f in facts if isinstance(f, SpeculativeAttemptScheduled)]
    assert (spec.vertex_id, spec.subtask) == ("sum counts -> out", 0)
    (won,) = [f for f in facts if isinstance(f, AttemptWon)]
    assert (won.attempt, won.losers) == (spec.attempt, [spec.original]), "the speculative attempt wins"
    placed = {
        f.attempt: f.taskmanager
        for f in facts
        if isinstance(f, UpdateTaskExecutionState)
        and f.vertex_id == "sum counts -> out"
        and f.subtask == 0
        and f.state == TaskState.SCHEDULED
    }
    assert placed[spec.attempt] != placed[spec.original], placed
    original = f"sum counts -> out:0:{spec.original}"

    def ends() -> list[TaskState]:
        return [
            f.state
            for f in job_facts(log, job_id)
            if isinstance(f, UpdateTaskExecutionState) and f.execution_id == original and f.state.terminal
        ]

    # The job finished with its winner; the loser, cancelled, ends as its TaskManager kills it.
    assert wait_until(ends, "the loser's end", timeout=60) == [TaskState.CANCELED]
    # Exactly plain PySpark's counts, read from the sink directory as Spark reads it.
    got = sorted((r["word"], r["count"]) for r in spark.read.parquet(str(out)).collect())
    lines = spark.read.text(str(text))
    words = F.explode(F.split(F.lower(F.col("value")), r"[^a-z0-9']+")).alias("word")
    want = sorted(
        (r["word"], r["count"])
        for r in lines.select(words).where(F.col("word") != "").groupBy("word").count().collect()
    )
    assert got == want
    # inspect job (and the dashboard's job page) mark the race; the projector's tables agree with the log.
    story = timeline(log, job_id)
    marks = {
        a["attempt"]: (a.get("speculative") is not None, a.get("race"))
        for a in story["attempts"]
        if a["vertex"] == "sum counts -> out" and a["subtask"] == 0
    }
    assert marks == {spec.original: (False, "lost"), spec.attempt: (True, "won")}, marks
    assert {e["kind"] for e in story["events"]} >= {"speculative", "won"}
    assert story["job"]["tasks_total"] == 6  # a speculative attempt is not another task
    Projector(log).catch_up()
    Projector(log).catch_up()
    result = check(log)
    assert result.agree, [vars(d) for d in result.differences[:10]]
