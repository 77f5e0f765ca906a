"""Input splits and coordinators end to end: real Redis, JobManagers, TaskManagers, RQ
workers and Spark. Readers ask for splits one at a time; every split must be read exactly
once in the committed output, whatever dies."""

from __future__ import annotations

import os
import signal
import subprocess
from collections import Counter
from pathlib import Path

import orjson
import pytest

from sluice.client import Client, load_job
from sluice.events import (
    CoordinatorCheckpointed,
    JobStatus,
    NextInputSplit,
    OperatorEvent,
    RequestNextInputSplit,
    TaskState,
    UpdateTaskExecutionState,
)
from sluice.services.coordination.timeline import split_timeline
from sluice.services.jobs.state import TERMINAL_JOB
from sluice.store import EventLog, current_leader
from tests.e2e.conftest import (
    MARGIN,
    SLACK,
    SPARK_START,
    TEARDOWN,
    Processes,
    assert_facts_after_takeover,
    grant_entry,
    registered,
    start_tm,
    wait_until,
    worker_pids,
)
from tests.e2e.test_jobs import JOBS, job_facts, run_job


@pytest.fixture
def cluster(procs: Processes, log: EventLog, spark_remote: str, tmp_path: Path):
    home = tmp_path / "home"
    procs.start(
        "jm",
        "jobmanager",
        "--storage-root",
        (tmp_path / "storage").as_uri(),
        "--slot-timeout",
        "120",
        "--id",
        "jm-a",
        env={"SLUICE_HOME": str(home), **SLACK},
    )
    return {"home": home, "spark": spark_remote}


def unique_lines(path: Path, n: int) -> list[str]:
    lines = [f"line-{i:06d} " + "x" * (i % 17) for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return lines


def output_lines(spark, out: Path) -> list[str]:
    return sorted(r["value"] for r in spark.read.parquet(str(out)).collect())


def timeline(log: EventLog, job_id: str):
    return split_timeline(env for _, env in log.replay(log.keys.facts(log.keys.job(job_id))))


def assert_each_split_finished_once(log: EventLog, job_id: str) -> list:
    rows = timeline(log, job_id)
    finished = Counter(r.split for r in rows if r.outcome == "finished")
    assert finished and set(finished.values()) == {1}, finished
    assert {r.split for r in rows} == set(finished), "a split handed out never finished"
    return rows


@pytest.mark.timeout(SPARK_START + 120 + 60 + 60 + MARGIN + TEARDOWN)  # the job, two commands
@pytest.mark.parametrize("protocol", ["operator-events", "input-splits"])
def test_every_split_is_read_exactly_once_by_either_protocol(
    procs: Processes, log: EventLog, cluster: dict, spark, tmp_path: Path, protocol: str
) -> None:
    start_tm(procs, cluster, "tm-1")
    want = unique_lines(tmp_path / "in.txt", 3000)
    job_id, job = run_job(
        log,
        JOBS / "lines.py",
        {
            "input": str(tmp_path / "in.txt"),
            "output": str(tmp_path / "out"),
            "protocol": protocol,
            "split_bytes": "2048",
        },
    )
    assert job.status == JobStatus.FINISHED, job.reason
    assert output_lines(spark, tmp_path / "out") == sorted(want)
    rows = assert_each_split_finished_once(log, job_id)
    facts = job_facts(log, job_id)
    if protocol == "input-splits":
        assert sum(isinstance(f, RequestNextInputSplit) for f in facts) == len(rows) + 2  # + one "none left" each
        assert sum(isinstance(f, NextInputSplit) and f.split is None for f in facts) == 2
    else:
        asks = [f for f in facts if isinstance(f, OperatorEvent) and f.to_coordinator]
        assert len(asks) == len(rows) + 2 and all(f.body["type"] == "request-split" for f in asks)
    assert any(isinstance(f, CoordinatorCheckpointed) for f in facts)
    # The timeline shows who took what.
    shown = subprocess.run(
        _sluice(log, "inspect", "splits", job_id), capture_output=True, text=True, timeout=60, check=False
    )
    assert shown.returncode == 0, shown.stderr
    assert "finished splits per subtask" in shown.stdout
    as_json = subprocess.run(
        _sluice(log, "inspect", "splits", job_id, "--json"), capture_output=True, text=True, timeout=60, check=False
    )
    first = orjson.loads(as_json.stdout.splitlines()[0])
    assert first["split"] == 0 and first["what"].endswith("in.txt bytes 0..2048") and first["outcome"] == "finished"


def _sluice(log: EventLog, *args: str) -> list[str]:
    import sys

    url = log.client.connection_pool.connection_kwargs
    return [
        sys.executable,
        "-m",
        "sluice",
        "--redis",
        f"redis://{url['host']}:{url['port']}",
        "--prefix",
        log.keys.prefix,
        *args,
    ]


@pytest.mark.timeout(SPARK_START + 90 + 120 + MARGIN + TEARDOWN)  # three splits, the job
def test_a_failed_readers_splits_go_back_to_the_pool_and_are_read_once(
    procs: Processes, log: EventLog, cluster: dict, spark, tmp_path: Path
) -> None:
    # 4 KB/s per reader and 1 KB splits: each reader takes about 4 splits a second.
    start_tm(procs, cluster, "tm-1", env={"SLUICE_IO_RATE": "4096"})
    want = unique_lines(tmp_path / "in.txt", 1500)
    client = Client(log)
    job_id = client.submit(
        load_job(
            JOBS / "lines.py",
            {
                "input": str(tmp_path / "in.txt"),
                "parallelism": "2",
                "output": str(tmp_path / "out"),
                "split_bytes": "1024",
            },
        )
    )
    victim = wait_until(
        lambda: next(
            (
                r
                for r in timeline(log, job_id)
                if r.subtask == 0 and r.attempt == 0 and sum(1 for x in timeline(log, job_id) if x.subtask == 0) >= 3
            ),
            None,
        ),
        "subtask 0 to hold 3 splits",
        timeout=90,
    )
    slot = next(
        f.slot
        for f in job_facts(log, job_id)
        if isinstance(f, UpdateTaskExecutionState) and f.subtask == 0 and f.state == TaskState.DEPLOYING
    )
    # This cluster's worker, matched by key prefix: a pattern on "tm-1 --slot 0" alone also
    # matches the workers of any other test run on the machine, and may kill one of theirs.
    (pid,) = worker_pids(procs.prefix, "tm-1", slot)
    os.kill(pid, signal.SIGKILL)
    job = wait_until(lambda: (j := client.job(job_id)).status in TERMINAL_JOB and j, "the job to end", timeout=120)
    assert job.status == JobStatus.FINISHED, job.reason
    assert job.restarts == 1
    assert output_lines(spark, tmp_path / "out") == sorted(want)
    rows = assert_each_split_finished_once(log, job_id)
    returned = [r for r in rows if r.outcome == "returned"]
    assert victim.split in {r.split for r in returned}
    # Every returned split was handed out again, to some later reader, and finished there.
    again = {r.split: r for r in rows if r.outcome == "finished"}
    assert all(again[r.split].at > r.at for r in returned)


@pytest.mark.timeout(SPARK_START + 90 + 30 + 120 + MARGIN + TEARDOWN)  # a dozen splits, the checkpoint, the job
def test_a_jobmanager_killed_mid_split_heavy_job_loses_and_doubles_nothing(
    procs: Processes, log: EventLog, cluster: dict, spark, tmp_path: Path
) -> None:
    procs.start(
        "jm-b",
        "jobmanager",
        "--storage-root",
        (tmp_path / "storage").as_uri(),
        "--id",
        "jm-b",
        env={"SLUICE_HOME": str(cluster["home"]), **SLACK, "SLUICE_LEASE_TTL_MS": "1500"},
    )
    start_tm(procs, cluster, "tm-1", env={"SLUICE_IO_RATE": "8192"})
    want = unique_lines(tmp_path / "in.txt", 2500)  # about 60 KB: 60 splits of 1 KB
    client = Client(log)
    job_id = client.submit(
        load_job(
            JOBS / "lines.py",
            {
                "input": str(tmp_path / "in.txt"),
                "parallelism": "2",
                "output": str(tmp_path / "out"),
                "split_bytes": "1024",
            },
        )
    )
    wait_until(lambda: len(timeline(log, job_id)) >= 12, "a dozen splits handed out", timeout=90)
    taken = client.checkpoint(job_id)  # on demand, as `sluice checkpoint` does
    assert [c.operator_id for c in taken] == ["lines -> out"]
    before = len(timeline(log, job_id))
    grants = [e.event for _, e in log.replay(log.keys.facts(log.keys.cluster)) if e.type == "LeadershipGranted"]
    leader = {"jm-a": "jm", "jm-b": "jm-b"}[grants[-1].leader_id]  # either may have won the lease
    killed_epoch = grants[-1].epoch
    procs.signal(leader, signal.SIGKILL)
    job = wait_until(lambda: (j := client.job(job_id)).status in TERMINAL_JOB and j, "the job to end", timeout=120)
    assert job.status == JobStatus.FINISHED, job.reason
    assert output_lines(spark, tmp_path / "out") == sorted(want)  # what a run without the kill writes
    rows = assert_each_split_finished_once(log, job_id)
    epochs = sorted({r.epoch for r in rows})
    assert len(epochs) == 2 and len(rows) > before, "the new leader should have handed out the rest"
    # Every split answer, task state and the job's end after the takeover are the new leader's.
    after = assert_facts_after_takeover(log, log.keys.job(job_id), killed_epoch)
    assert any(isinstance(e.event, OperatorEvent) and not e.event.to_coordinator for e in after)
    assert any(e.type == "JobStatusChanged" and e.event.status == JobStatus.FINISHED for e in after)


@pytest.mark.timeout(SPARK_START + 90 + 120 + MARGIN + TEARDOWN)  # registrations, the job
def test_a_slow_reader_takes_fewer_splits(
    procs: Processes, log: EventLog, cluster: dict, spark, tmp_path: Path
) -> None:
    """Four readers, one five times slower: dynamic assignment gives it about a fifth as many
    splits as each fast one. (How long reading takes is for ``scripts/bench``: a wall-clock
    bound here would fail on a busy machine, not on a bad assignment.)"""
    rate = 40_000
    start_tm(procs, cluster, "tm-fast", slots=3, env={"SLUICE_IO_RATE": str(rate)})
    start_tm(procs, cluster, "tm-slow", slots=1, env={"SLUICE_IO_RATE": str(rate // 5)})
    wait_until(lambda: registered(log) == {"tm-fast", "tm-slow"}, "both TaskManagers", timeout=90)
    want = unique_lines(tmp_path / "in.txt", 14_000)  # about 330 KB: 80 splits of 4 KB
    job_id, job = run_job(
        log,
        JOBS / "lines.py",
        {"input": str(tmp_path / "in.txt"), "parallelism": "4", "output": str(tmp_path / "out"), "split_bytes": "4096"},
    )
    assert job.status == JobStatus.FINISHED, job.reason
    assert output_lines(spark, tmp_path / "out") == sorted(want)
    rows = assert_each_split_finished_once(log, job_id)
    tm_of = {
        f.subtask: f.taskmanager
        for f in job_facts(log, job_id)
        if isinstance(f, UpdateTaskExecutionState) and f.state == TaskState.DEPLOYING
    }
    per = Counter(r.subtask for r in rows)
    slow = [per[s] for s, tm in tm_of.items() if tm == "tm-slow"]
    fast = [per[s] for s, tm in tm_of.items() if tm == "tm-fast"]
    assert len(slow) == 1 and len(fast) == 3
    ratio = slow[0] / (sum(fast) / 3)
    print(f"splits per reader: fast {fast}, slow {slow}; slow/fast = {ratio:.2f}")
    assert 1 / 10 <= ratio <= 1 / 3, (fast, slow)


@pytest.mark.slow  # a minute and more: 17 Spark jobs of seconds each (tests/services/test_each_split.py is quick)
@pytest.mark.timeout(SPARK_START + 90 + 240 + MARGIN + TEARDOWN)  # registration, the job
def test_a_reader_slow_at_the_spark_work_takes_fewer_splits_when_each_split_is_worked_on_as_it_arrives(
    procs: Processes, log: EventLog, cluster: dict, spark, tmp_path: Path
) -> None:
    """Two readers; the Spark work on a split takes 4 s on subtask 0 and 0.5 s on the other
    (a sleep in the Spark server's Python worker), on top of what a Spark job per split
    costs anyway. The source is read ``each_split``: a reader asks for its next split only
    once its work on the last one is done, so each reader's share follows its speed at the
    whole work: the slow one's time per split is several times the fast one's, and it takes
    that much fewer splits. Read whole (the default), each would take about half: a reader
    copies every split it gets before any Spark work, and copies are equally fast."""
    start_tm(procs, cluster, "tm-1", slots=2)
    wait_until(lambda: registered(log) == {"tm-1"}, "the TaskManager", timeout=90)
    want = unique_lines(tmp_path / "in.txt", 3_000)  # about 70 KB: 17 splits of 4 KB
    job_id, job = run_job(
        log,
        JOBS / "slow_work.py",
        {"input": str(tmp_path / "in.txt"), "parallelism": "2", "output": str(tmp_path / "out"), "split_bytes": "4096"},
        timeout=240,
    )
    assert job.status == JobStatus.FINISHED, job.reason
    assert output_lines(spark, tmp_path / "out") == sorted(want)
    rows = assert_each_split_finished_once(log, job_id)
    per = Counter(r.subtask for r in rows)
    at = {s: sorted(r.at for r in rows if r.subtask == s) for s in (0, 1)}
    # Each reader's time per split: between two of its assignments it worked on one split.
    took = {s: (t[-1] - t[0]) / (len(t) - 1) / 1000 if len(t) > 1 else None for s, t in at.items()}
    share, speed = per[0] / per[1], (took[1] / took[0] if took[0] and took[1] else None)
    print(
        f"splits per reader: slow {per[0]}, fast {per[1]} (slow/fast {share:.2f}); seconds per split: "
        f"slow {took[0]}, fast {took[1]} (speed ratio {speed})"
    )
    assert per[0] >= 1 and share <= 0.45, per  # whole-task reading gives each about half
    assert took[1] is not None and (took[0] is None or took[0] >= 2 * took[1]), took  # slow at the work itself
    if speed is not None:  # the shares follow the speeds (a split's granularity aside)
        assert speed / 2 <= share <= speed * 2 + 1 / per[1], (share, speed)


@pytest.mark.timeout(SPARK_START + 120 + MARGIN + TEARDOWN)  # the job
def test_a_coordinator_and_its_subtasks_talk_both_ways(
    procs: Processes, log: EventLog, cluster: dict, spark, tmp_path: Path
) -> None:
    start_tm(procs, cluster, "tm-1")
    job_id, job = run_job(log, JOBS / "coordinated.py", {"output": str(tmp_path / "out"), "n": "1000"})
    assert job.status == JobStatus.FINISHED, job.reason
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    assert len(rows) == 1000 and {r["greeting"] for r in rows} == {"greeting-0", "greeting-1"}
    facts = job_facts(log, job_id)
    greetings = [
        f for f in facts if isinstance(f, OperatorEvent) and not f.to_coordinator and f.operator_id == "tag -> out"
    ]
    assert sorted((g.subtask, g.body["hello"]) for g in greetings) == [(0, "greeting-0"), (1, "greeting-1")]
    # Sent before the subtasks ran (the greeting waited in each subtask's inbox).
    first_running = next(
        i
        for i, f in enumerate(facts)
        if isinstance(f, UpdateTaskExecutionState) and f.vertex_id == "tag -> out" and f.state == TaskState.RUNNING
    )
    assert facts.index(greetings[-1]) < first_running
    thanks = [f for f in facts if isinstance(f, OperatorEvent) and f.to_coordinator and f.operator_id == "tag -> out"]
    assert sorted(t.subtask for t in thanks) == [0, 1] and sum(t.body["rows"] for t in thanks) == 1000
    checkpoints = [f for f in facts if isinstance(f, CoordinatorCheckpointed) and f.operator_id == "tag -> out"]
    # The greetings were held back until the checkpoint that covers them, which released them.
    releasing = next(c for c in checkpoints if c.released)
    assert releasing.released == 2 and releasing.state["greeted"]
    assert facts.index(releasing) == facts.index(greetings[-1]) + 1
    # A last checkpoint when the job ends keeps the coordinator's final state in the log.
    assert sorted(t[0] for t in checkpoints[-1].state["thanks"]) == [0, 1]


@pytest.mark.timeout(SPARK_START + 30 + 120 + 30 + 120 + MARGIN + TEARDOWN)
def test_a_jobmanager_killed_between_two_inputs_of_a_nondeterministic_coordinator_loses_nothing(
    procs: Processes, log: EventLog, spark_remote: str, spark, tmp_path: Path
) -> None:
    """The Greeter (tests/e2e/jobs/coordinated.py) is not deterministic. Kill its leader right
    after the first subtask's thanks is in the log and before any checkpoint covers it (no
    on-demand checkpoint, and no periodic one: the interval is longer than the test); the
    second subtask thanks only after the takeover. The new leader restores the checkpoint
    taken when the greetings went out, replays the first thanks from the log, takes the
    second live: each greeting went out once, each thanks counts once, the output is exact."""
    from tests.e2e.jobs.coordinated import Greeter

    assert Greeter.deterministic is False
    home, storage = tmp_path / "home", (tmp_path / "storage").as_uri()
    jm_env = {
        "SLUICE_HOME": str(home),
        **SLACK,
        "SLUICE_LEASE_TTL_MS": "1500",
        "SLUICE_CHECKPOINT_INTERVAL_MS": "600000",
    }
    procs.start("jm-a", "jobmanager", "--storage-root", storage, "--id", "jm-a", env=jm_env)
    wait_until(lambda: current_leader(log), "jm-a to lead", timeout=30)
    procs.start("jm-b", "jobmanager", "--storage-root", storage, "--id", "jm-b", env=jm_env)
    gate = tmp_path / "gate"
    start_tm(procs, {"home": home, "spark": spark_remote}, "tm-1", env={"SLUICE_TEST_GATE": str(gate)})
    client = Client(log)
    job_id = client.submit(load_job(JOBS / "coordinated.py", {"output": str(tmp_path / "out"), "n": "1000"}))

    def thanks_from(subtask: int):
        return next(
            (
                (i, e)
                for i, e in log.replay(log.keys.facts(log.keys.job(job_id)))
                if isinstance(e.event, OperatorEvent)
                and e.event.to_coordinator
                and e.event.operator_id == "tag -> out"
                and e.event.subtask == subtask
            ),
            None,
        )

    first_id, first = wait_until(lambda: thanks_from(0), "subtask 0 to thank the coordinator", timeout=120)
    assert first.epoch == 1 and current_leader(log).holder == "jm-a"
    procs.signal("jm-a", signal.SIGKILL)
    wait_until(
        lambda: (h := current_leader(log)) is not None and h.holder == "jm-b" and h.epoch == 2 and grant_entry(log, 2),
        "jm-b to take over",
        timeout=30,
    )
    assert thanks_from(1) is None  # still waiting at the gate
    gate.write_text("open")
    job = wait_until(lambda: (j := client.job(job_id)).status in TERMINAL_JOB and j, "the job to end", timeout=120)
    assert job.status == JobStatus.FINISHED and job.restarts == 0, job.reason
    # The first thanks was not covered by a checkpoint when jm-a died: jm-b replayed it.
    entries = list(log.replay(log.keys.facts(log.keys.job(job_id))))
    grant = grant_entry(log, 2)
    between = [e for i, e in entries if _before(first_id, i) and _before(i, grant)]
    assert not any(
        isinstance(e.event, CoordinatorCheckpointed) and e.event.operator_id == "tag -> out" for e in between
    )
    facts = [e.event for _, e in entries]
    greetings = [
        f for f in facts if isinstance(f, OperatorEvent) and not f.to_coordinator and f.operator_id == "tag -> out"
    ]
    assert sorted((g.subtask, g.body["hello"]) for g in greetings) == [(0, "greeting-0"), (1, "greeting-1")]
    thanks = [f for f in facts if isinstance(f, OperatorEvent) and f.to_coordinator and f.operator_id == "tag -> out"]
    assert sorted(t.subtask for t in thanks) == [0, 1]
    final = [f for f in facts if isinstance(f, CoordinatorCheckpointed) and f.operator_id == "tag -> out"][-1]
    assert sorted(final.state["thanks"]) == sorted([t.subtask, t.attempt, t.body["rows"]] for t in thanks)
    # Exact output: every number once, each tagged with the greeting of the subtask that
    # read it, as many per subtask as that subtask told the coordinator.
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    assert sorted(r["id"] for r in rows) == list(range(1000))
    per_greeting = Counter(r["greeting"] for r in rows)
    assert per_greeting == {f"greeting-{t.subtask}": t.body["rows"] for t in thanks}
    assert_facts_after_takeover(log, log.keys.job(job_id), 1)


def _before(a: str, b: str) -> bool:
    return tuple(map(int, a.split("-"))) < tuple(map(int, b.split("-")))


@pytest.mark.longer  # 10-30 s: run by CI in its own step (pytest -m longer)
@pytest.mark.timeout(SPARK_START + 120 + 120 + MARGIN + TEARDOWN)  # two jobs
def test_a_coordinator_that_raises_fails_its_job_but_not_the_jobmanager(
    procs: Processes, log: EventLog, cluster: dict, tmp_path: Path
) -> None:
    start_tm(procs, cluster, "tm-1")
    _, job = run_job(log, JOBS / "coordinated.py", {"output": str(tmp_path / "out"), "explode": "1"})
    assert job.status == JobStatus.FAILED and job.restarts == 0
    assert "the coordinator of 'tag -> out' failed in handle_event_from_operator" in job.reason
    assert (
        job.reason.rstrip().endswith("RuntimeError: the greeter cannot take thanks from subtask 0")
        or "RuntimeError: the greeter cannot take thanks from subtask" in job.reason
    )
    # The JobManager lives on and runs the next job.
    _, ok = run_job(log, JOBS / "coordinated.py", {"output": str(tmp_path / "out2"), "n": "10"})
    assert ok.status == JobStatus.FINISHED, ok.reason
    assert procs.procs["jm"].poll() is None


@pytest.mark.timeout(SPARK_START + 120 + MARGIN + TEARDOWN)  # the job
def test_a_reader_that_gets_no_split_still_has_the_sources_columns(
    procs: Processes, log: EventLog, cluster: dict, spark, tmp_path: Path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"n": list(range(100)), "name": [f"n{i}" for i in range(100)]}), tmp_path / "in.parquet")
    start_tm(procs, cluster, "tm-1")
    job_id, job = run_job(
        log,
        JOBS / "parquet_filter.py",
        {"input": str(tmp_path / "in.parquet"), "output": str(tmp_path / "out"), "parallelism": "3"},
    )
    assert job.status == JobStatus.FINISHED, job.reason
    assert len(timeline(log, job_id)) == 1  # one split, three readers: two read nothing
    got = spark.read.parquet(str(tmp_path / "out"))
    assert sorted(got.columns) == ["n", "name"]
    assert sorted(r["n"] for r in got.collect()) == list(range(0, 100, 2))
