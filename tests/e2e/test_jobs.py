"""Jobs end to end on real Redis, real processes (JobManager, TaskManager, RQ workers) and
real Spark (one Spark Connect server for the test run)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from sluice.client import Client, load_job
from sluice.events import (
    JobSlotsFound,
    JobStatus,
    JobWaitingForSlots,
    ScheduleOrUpdateConsumers,
    TaskState,
    UpdateTaskExecutionState,
)
from sluice.services.jobs.state import TERMINAL_JOB
from sluice.services.projector import Projector
from sluice.store import EventLog, ReadModels
from tests.e2e.conftest import (
    MARGIN,
    SLACK,
    SPARK_START,
    TEARDOWN,
    Processes,
    alive,
    assert_facts_after_takeover,
    cluster_pids,
    registered,
    start_tm,
    wait_until,
    worker_pids,
)

ROOT = Path(__file__).resolve().parents[2]
JOBS = Path(__file__).parent / "jobs"


def write_lines(path: Path, n: int = 2000) -> Path:
    words = ["alpha", "beta", "gamma", "delta", "epsilon"]
    path.write_text("\n".join(" ".join(words[(i * 7 + k) % 5] for k in range(i % 6 + 1)) for i in range(n)) + "\n")
    return path


def run_job(log: EventLog, file: Path, params: dict, timeout: float = 120):
    client = Client(log)
    job_id = client.submit(load_job(file, params))
    job = wait_until(
        lambda: (j := client.job(job_id, missing_ok=True)) is not None and j.status in TERMINAL_JOB and j,
        f"job {job_id} to end",
        timeout=timeout,
    )
    return job_id, job


def job_facts(log: EventLog, job_id: str) -> list:
    return [e.event for _, e in log.replay(log.keys.facts(log.keys.job(job_id)))]


@pytest.mark.timeout(SPARK_START + 90 + 120 + MARGIN + TEARDOWN)  # registration, the job
def test_wordcount_counts_match_plain_pyspark_and_consumers_deploy_after_their_producers(
    procs: Processes, log: EventLog, cluster: dict, spark, tmp_path: Path
) -> None:
    start_tm(procs, cluster, "tm-1")
    wait_until(lambda: registered(log) == {"tm-1"}, "the TaskManager", timeout=90)
    text = write_lines(tmp_path / "in.txt")
    out = tmp_path / "out"
    job_id, job = run_job(
        log,
        ROOT / "examples" / "wordcount.py",
        {"input": str(text), "output": str(out), "parallelism": "3", "split_bytes": "4096"},
    )
    assert job.status == JobStatus.FINISHED, job.reason
    from pyspark.sql import functions as F

    got = {r["word"]: r["count"] for r in spark.read.parquet(str(out)).collect()}
    lines = spark.read.text(str(text))
    words = lines.select(F.explode(F.split(F.lower("value"), r"[^a-z0-9']+")).alias("word")).where("word != ''")
    want = {r["word"]: r["count"] for r in words.groupBy("word").count().collect()}
    assert got == want and sum(got.values()) > 2000
    # Lazy deployment: no consumer was scheduled before every producer had data.
    facts = job_facts(log, job_id)
    produced = [i for i, f in enumerate(facts) if isinstance(f, ScheduleOrUpdateConsumers)]
    consumer_scheduled = [
        i
        for i, f in enumerate(facts)
        if isinstance(f, UpdateTaskExecutionState)
        and f.state == TaskState.SCHEDULED
        and f.vertex_id.startswith("sum counts")
    ]
    assert len(produced) == 3 and len(consumer_scheduled) == 2
    assert max(produced) < min(consumer_scheduled)
    # Every task state change is in the log, in order, for every subtask.
    for vertex, n in (("lines -> count words", 3), ("sum counts -> out", 2)):
        for sub in range(n):
            states = [
                f.state
                for f in facts
                if isinstance(f, UpdateTaskExecutionState) and f.vertex_id == vertex and f.subtask == sub
            ]
            assert states == [
                TaskState.SCHEDULED,
                TaskState.DEPLOYING,
                TaskState.INITIALIZING,
                TaskState.RUNNING,
                TaskState.FINISHED,
            ]
    # The ExecutionGraph table, rebuilt from the log, is the same table.
    Projector(log).catch_up()
    tables = ReadModels(log)
    tag = log.keys.job(job_id)
    _, before = tables.read(tag, "executiongraph")
    assert before["job"]["status"] == "FINISHED" and len(before) == 1 + 5
    log.client.delete(log.keys.table(tag, "executiongraph"), log.keys.position(tag, "executiongraph"))
    Projector(log).catch_up()
    assert tables.read(tag, "executiongraph")[1] == before


@pytest.mark.timeout(SPARK_START + 120 + MARGIN + TEARDOWN)  # the job
def test_user_code_that_raises_is_restarted_then_the_job_fails_with_the_users_error(
    procs: Processes, log: EventLog, cluster: dict, tmp_path: Path
) -> None:
    start_tm(procs, cluster, "tm-1")
    text = write_lines(tmp_path / "in.txt", 10)
    job_id, job = run_job(log, JOBS / "failing.py", {"input": str(text), "output": str(tmp_path / "o")})
    assert job.status == JobStatus.FAILED
    assert job.restarts == 2
    assert job.reason.startswith("task lines -> explode -> out[0] failed after 2 restarts: Traceback")
    assert "line 8, in explode" in job.reason and job.reason.endswith("ValueError: bad input row 42")
    attempts = {
        f.attempt
        for f in job_facts(log, job_id)
        if isinstance(f, UpdateTaskExecutionState) and f.state == TaskState.FAILED
    }
    assert attempts == {0, 1, 2}


@pytest.mark.timeout(SPARK_START + 90 + 90 + MARGIN + TEARDOWN)  # the stall, the job
def test_a_worker_killed_mid_task_leads_to_a_restart_not_a_hang(
    procs: Processes, log: EventLog, cluster: dict, tmp_path: Path, monkeypatch
) -> None:
    marker = tmp_path / "marker"
    start_tm(procs, cluster, "tm-1", slots=1, env={"SLUICE_TEST_MARKER": str(marker)})
    text = write_lines(tmp_path / "in.txt", 10)
    client = Client(log)
    job_id = client.submit(load_job(JOBS / "slow.py", {"input": str(text), "output": str(tmp_path / "o")}))
    pid = int(wait_until(lambda: marker.exists() and marker.read_text(), "the task to stall", timeout=90))
    os.kill(pid, signal.SIGKILL)
    job = wait_until(lambda: (j := client.job(job_id)).status in TERMINAL_JOB and j, "the job to end", timeout=90)
    assert job.status == JobStatus.FINISHED and job.restarts == 1
    failed = [
        f for f in job_facts(log, job_id) if isinstance(f, UpdateTaskExecutionState) and f.state == TaskState.FAILED
    ]
    assert len(failed) == 1 and "died (signal 9)" in failed[0].error


@pytest.mark.timeout(SPARK_START + 90 + 90 + 30 + 10 + 10 + MARGIN + TEARDOWN)
def test_cancelling_a_running_job_kills_the_worker_that_runs_its_task(
    procs: Processes, log: EventLog, cluster: dict, tmp_path: Path
) -> None:
    """``sluice cancel`` while the task runs (stalled in the user's code): the job ends
    CANCELED, the worker process that ran the task is killed (its Python is stuck in
    time.sleep: nothing short of a kill stops it) and a fresh worker takes its slot, and
    no process of this cluster runs the task any more."""
    import subprocess
    import sys

    marker = tmp_path / "marker"
    start_tm(procs, cluster, "tm-1", env={"SLUICE_TEST_MARKER": str(marker)})
    text = write_lines(tmp_path / "in.txt", 10)
    client = Client(log)
    job_id = client.submit(load_job(JOBS / "slow.py", {"input": str(text), "output": str(tmp_path / "o")}))
    pid = int(wait_until(lambda: marker.exists() and marker.read_text(), "the task to run", timeout=90))
    slot = next(
        f.slot
        for f in job_facts(log, job_id)
        if isinstance(f, UpdateTaskExecutionState) and f.state == TaskState.DEPLOYING
    )
    assert worker_pids(procs.prefix, "tm-1", slot) == [pid]  # the marker holds the pid of the slot's worker
    cancel = subprocess.run(
        [sys.executable, "-m", "sluice", "--redis", procs.url, "--prefix", procs.prefix, "cancel", job_id],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    job = wait_until(lambda: (j := client.job(job_id)).status in TERMINAL_JOB and j, "the job to end", timeout=30)
    assert job.status == JobStatus.CANCELED
    assert {ex.state for ex in job.executions()} == {TaskState.CANCELED}
    assert job.restarts == 0
    wait_until(lambda: not alive(pid), f"the worker that ran the task (pid {pid}) to be killed", timeout=10)
    fresh = wait_until(lambda: worker_pids(procs.prefix, "tm-1", slot), f"a fresh worker for slot {slot}", timeout=10)
    assert len(fresh) == 1 and fresh[0] != pid
    # Nothing of this cluster runs the task: its processes are the JobManager, the
    # TaskManager and one worker per slot, none of them the killed one.
    ours = cluster_pids(procs.prefix)
    assert pid not in ours
    assert sorted(ours) == sorted([procs.procs["jm"].pid, procs.procs["tm-1"].pid, *worker_pids(procs.prefix, "tm-1")])
    assert len(worker_pids(procs.prefix, "tm-1")) == 2
    assert "cancelling task" in procs.output("tm-1")


@pytest.mark.timeout(SPARK_START + 20 + 120 + MARGIN + TEARDOWN)  # waiting, the job
def test_a_job_waits_for_slots_and_runs_when_a_taskmanager_joins(
    procs: Processes, log: EventLog, cluster: dict, tmp_path: Path
) -> None:
    text = write_lines(tmp_path / "in.txt", 100)
    client = Client(log)
    job_id = client.submit(
        load_job(ROOT / "examples" / "wordcount.py", {"input": str(text), "output": str(tmp_path / "o")})
    )
    wait_until(lambda: any(isinstance(f, JobWaitingForSlots) for f in job_facts(log, job_id)), "the job to wait")
    assert client.job(job_id).status == JobStatus.CREATED
    start_tm(procs, cluster, "tm-late")
    job = wait_until(lambda: (j := client.job(job_id)).status in TERMINAL_JOB and j, "the job to end", timeout=120)
    assert job.status == JobStatus.FINISHED, job.reason
    # Each wait is one fact and its end another, the first before any task was placed; none
    # is left open (the reducers may wait again while the sources hold the slots).
    facts = job_facts(log, job_id)
    waits = [type(f).__name__ for f in facts if isinstance(f, (JobWaitingForSlots, JobSlotsFound))]
    assert waits and waits == ["JobWaitingForSlots", "JobSlotsFound"] * (len(waits) // 2), waits
    first = next(
        f
        for f in facts
        if isinstance(f, JobWaitingForSlots)
        or (isinstance(f, UpdateTaskExecutionState) and f.state == TaskState.SCHEDULED)
    )
    assert isinstance(first, JobWaitingForSlots)


@pytest.mark.timeout(60 + MARGIN)  # the command
def test_an_invalid_job_is_refused_before_anything_runs(tmp_path: Path) -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "sluice", "run", str(JOBS / "invalid.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    assert "job 'invalid' is not valid" in proc.stderr
    assert "has parallelism 8; it must be between 1 and the max parallelism 4" in proc.stderr
    assert "not importable by name" in proc.stderr
    assert not (tmp_path / ".sluice" / "redis").exists()  # nothing was started


@pytest.mark.timeout(SPARK_START + 120 + MARGIN + TEARDOWN)  # the job
def test_the_clickstream_example_matches_plain_pyspark(
    procs: Processes, log: EventLog, cluster: dict, spark, tmp_path: Path
) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("clickstream_example", ROOT / "examples" / "clickstream.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.generate(tmp_path / "clicks", files=2, rows=5000)
    start_tm(procs, cluster, "tm-1")
    _, job = run_job(
        log,
        ROOT / "examples" / "clickstream.py",
        {"input": str(tmp_path / "clicks"), "output": str(tmp_path / "out"), "split_bytes": "20000"},
    )
    assert job.status == JobStatus.FINISHED, job.reason
    got = sorted(tuple(r) for r in spark.read.parquet(str(tmp_path / "out")).collect())
    want = sorted(
        tuple(r)
        for r in example.per_user(example.per_user_page(spark.read.parquet(str(tmp_path / "clicks")))).collect()
    )
    assert got == want and len(got) > 1000


@pytest.mark.timeout(SPARK_START + 300 + MARGIN)  # sluice run
def test_sluice_run_the_readme_command_gives_the_right_counts(spark_remote: str, spark, tmp_path: Path) -> None:
    """`sluice run examples/wordcount.py` on the embedded cluster (sharing the test run's
    Spark server), with progress, a summary, exit code 0, and counts equal to plain PySpark's."""
    import subprocess
    import sys

    from pyspark.sql import functions as F

    text = write_lines(tmp_path / "in.txt", 3000)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env["SLUICE_SPARK_REMOTE"] = spark_remote
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sluice",
            "run",
            str(ROOT / "examples" / "wordcount.py"),
            "-p",
            f"input={text}",
            "-p",
            f"output={tmp_path / 'out'}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "FINISHED" in proc.stdout and f"output: {tmp_path / 'out'}" in proc.stdout
    got = {r["word"]: r["count"] for r in spark.read.parquet(str(tmp_path / "out")).collect()}
    words = spark.read.text(str(text)).select(F.explode(F.split(F.lower("value"), r"[^a-z0-9']+")).alias("word"))
    want = {r["word"]: r["count"] for r in words.where("word != ''").groupBy("word").count().collect()}
    assert got == want


@pytest.mark.timeout(SPARK_START + 90 + 120 + MARGIN + TEARDOWN)  # running, the job
def test_a_running_job_survives_a_jobmanager_kill(
    procs: Processes, log: EventLog, cluster: dict, spark, tmp_path: Path
) -> None:
    """kill -9 the leading JobManager while the job runs: the standby rebuilds the job from
    its facts, serves its inbox and the job finishes with the right result."""
    procs.start(
        "jm-b",
        "jobmanager",
        "--storage-root",
        (tmp_path / "storage").as_uri(),
        "--id",
        "jm-b",
        env={"SLUICE_HOME": str(cluster["home"]), **SLACK, "SLUICE_LEASE_TTL_MS": "1500"},
    )
    start_tm(procs, cluster, "tm-1")
    text = write_lines(tmp_path / "in.txt", 20000)
    client = Client(log)
    job_id = client.submit(
        load_job(
            ROOT / "examples" / "wordcount.py",
            {"input": str(text), "output": str(tmp_path / "out"), "parallelism": "4", "split_bytes": "16384"},
        )
    )
    wait_until(
        lambda: (j := client.job(job_id, missing_ok=True)) is not None and j.status == JobStatus.RUNNING,
        "the job to run",
        timeout=90,
    )
    grants = [e.event for _, e in log.replay(log.keys.facts(log.keys.cluster)) if e.type == "LeadershipGranted"]
    first, killed_epoch = grants[-1].leader_id, grants[-1].epoch  # either JobManager may have won the lease
    procs.signal("jm-b" if first == "jm-b" else "jm", signal.SIGKILL)
    job = wait_until(lambda: (j := client.job(job_id)).status in TERMINAL_JOB and j, "the job to end", timeout=120)
    assert job.status == JobStatus.FINISHED, job.reason
    grants = [e.event for _, e in log.replay(log.keys.facts(log.keys.cluster)) if e.type == "LeadershipGranted"]
    assert grants[-1].leader_id != first
    # The standby carried the job: what was committed after its grant is at its epoch, down
    # to the job's end.
    after = assert_facts_after_takeover(log, log.keys.job(job_id), killed_epoch)
    assert any(isinstance(e.event, UpdateTaskExecutionState) for e in after)
    assert any(e.type == "JobStatusChanged" and e.event.status == JobStatus.FINISHED for e in after)
    from pyspark.sql import functions as F

    got = {r["word"]: r["count"] for r in spark.read.parquet(str(tmp_path / "out")).collect()}
    words = spark.read.text(str(text)).select(F.explode(F.split(F.lower("value"), r"[^a-z0-9']+")).alias("word"))
    assert got == {r["word"]: r["count"] for r in words.where("word != ''").groupBy("word").count().collect()}


@pytest.mark.timeout(SPARK_START + 90 + 20 + 120 + 10 + MARGIN + TEARDOWN)  # the stall, lost, the job, the stale worker
def test_a_taskmanager_declared_lost_while_alive_drops_its_tasks_and_rejoins(
    procs: Processes, log: EventLog, spark_remote: str, tmp_path: Path
) -> None:
    """Freeze a TaskManager past the heartbeat timeout: the leader declares it lost and fails
    its task; when it wakes up it is told to register again, drops the stale task (killing
    the worker that runs it) and the job's restarted attempt finishes on it."""
    quick = {
        "SLUICE_HEARTBEAT_INTERVAL_MS": "200",
        "SLUICE_HEARTBEAT_TIMEOUT_MS": "2000",
        "SLUICE_LEASE_TTL_MS": "5000",
    }
    home = tmp_path / "home"
    procs.start(
        "jm", "jobmanager", "--storage-root", (tmp_path / "storage").as_uri(), env={"SLUICE_HOME": str(home), **quick}
    )
    marker = tmp_path / "marker"
    procs.start(
        "tm-1",
        "taskmanager",
        "--resource-id",
        "tm-1",
        "--slots",
        "1",
        "--spark",
        spark_remote,
        env={"SLUICE_HOME": str(home), "SLUICE_TEST_MARKER": str(marker), **quick},
    )
    client = Client(log)
    text = write_lines(tmp_path / "in.txt", 10)
    job_id = client.submit(load_job(JOBS / "slow.py", {"input": str(text), "output": str(tmp_path / "o")}))
    stalled_worker = int(wait_until(lambda: marker.exists() and marker.read_text(), "the task to stall", timeout=90))
    procs.signal("tm-1", signal.SIGSTOP)
    wait_until(
        lambda: any(e.type == "TaskManagerLost" for _, e in log.replay(log.keys.facts(log.keys.cluster))),
        "the TaskManager to be declared lost",
    )
    procs.signal("tm-1", signal.SIGCONT)
    job = wait_until(lambda: (j := client.job(job_id)).status in TERMINAL_JOB and j, "the job to end", timeout=120)
    assert job.status == JobStatus.FINISHED and job.restarts == 1, job.reason
    wait_until(lambda: not Path(f"/proc/{stalled_worker}").exists(), "the stale worker to be gone", timeout=10)
