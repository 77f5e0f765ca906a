"""Starting a task failing for real (FLINK-1672 end to end): a real start step fails inside
a real TaskManager process, the TaskManager answers ``TaskOperationResult(success=False)``
naming the step, the job restarts as its strategy allows and then fails with that step as
its root cause, and the TaskManager is left clean: nothing of the task stays behind, and
its slot runs the next job.

(tests/services/test_task_start.py covers every step failing, with stubbed steps.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.client import Client, load_job
from sluice.events import (
    JobStatus,
    JobWaitingForSlots,
    TaskOperationResult,
    TaskRestartScheduled,
    TaskState,
    UpdateTaskExecutionState,
)
from sluice.services.jobs.state import TERMINAL_JOB
from sluice.store import EventLog
from tests.e2e.conftest import MARGIN, SPARK_START, TEARDOWN, Processes, entry_ms, start_tm, wait_until
from tests.e2e.test_jobs import JOBS, job_facts, write_lines

VERTEX = "lines -> out"
ATTEMPTS = 2  # restarts the job's strategy allows (lines.py with attempts=2: fixed delay, 100 ms)


def wait_for_end(client: Client, job_id: str, timeout: float = 120):
    return wait_until(
        lambda: (j := client.job(job_id, missing_ok=True)) is not None and j.status in TERMINAL_JOB and j,
        f"job {job_id} to end",
        timeout=timeout,
    )


def assert_failed_at_start(log: EventLog, job_id: str, job, tm: str, step: str, cause: str) -> None:
    """Every attempt failed at ``step`` on ``tm``: the TaskManager's answers, the job's facts
    and its root cause all say so, and no attempt ever got as far as running."""
    started = f"starting the task failed at step '{step}': {cause}"
    assert job.status == JobStatus.FAILED, job.reason
    assert job.restarts == ATTEMPTS
    assert job.reason.startswith(
        f"task {VERTEX}[0] failed after {ATTEMPTS} restarts: deployment failed on {tm}: {started}"
    ), job.reason
    # The TaskManager's answers, in the job's inbox: one failed TaskOperationResult per attempt.
    answers = [
        e.event for _, e in log.replay(log.keys.inbox(log.keys.job(job_id))) if isinstance(e.event, TaskOperationResult)
    ]
    assert [a.success for a in answers] == [False] * (ATTEMPTS + 1), answers
    assert all(a.message.startswith(started) for a in answers), answers
    assert sorted(a.execution_id for a in answers) == [f"{VERTEX}:0:{n}" for n in range(ATTEMPTS + 1)]
    # The job's facts: each attempt went SCHEDULED -> DEPLOYING -> FAILED with that cause,
    # and the restarts the strategy allows were scheduled.
    facts = job_facts(log, job_id)
    for attempt in range(ATTEMPTS + 1):
        states = [
            (f.state, f.error)
            for f in facts
            if isinstance(f, UpdateTaskExecutionState) and f.vertex_id == VERTEX and f.attempt == attempt
        ]
        assert [s for s, _ in states] == [TaskState.SCHEDULED, TaskState.DEPLOYING, TaskState.FAILED], states
        assert states[-1][1].startswith(f"deployment failed on {tm}: {started}"), states[-1][1]
    assert [f.attempt for f in facts if isinstance(f, TaskRestartScheduled)] == list(range(1, ATTEMPTS + 1))


def assert_slot_free_again(log: EventLog, tm: str, slots: int, after_ms: int) -> None:
    """A heartbeat of ``tm`` sent after ``after_ms`` reports every slot free (a task left in
    its task table would keep one busy)."""

    def beat():
        return [
            e.event
            for i, e in log.replay(log.keys.inbox(log.keys.cluster), f"{after_ms}-0")
            if e.type == "TaskManagerHeartbeat" and e.event.resource_id == tm
        ]

    beats = wait_until(beat, f"a heartbeat of {tm} after the failure", timeout=20)
    assert beats[-1].slots_free == slots, beats[-1]


def assert_start_failure_logged(procs: Processes, tm: str, step: str, undone: list[str]) -> None:
    """The TaskManager undid the steps done before ``step``, last first (it logs which)."""
    lines = [x for x in procs.output(tm).splitlines() if "task start failed" in x]
    assert len(lines) == ATTEMPTS + 1, lines
    for x in lines:
        assert f"step='{step}'" in x and f"undone={undone!r}" in x, x


def run_later_job(log: EventLog, client: Client, tmp_path: Path, tm: str, name: str) -> None:
    """The next job on the same TaskManager and slot finishes: the failed starts freed it."""
    text = write_lines(tmp_path / f"{name}.txt", 50)
    job_id = client.submit(
        load_job(
            JOBS / "lines.py",
            {"input": str(text), "output": str(tmp_path / name), "parallelism": "1", "attempts": str(ATTEMPTS)},
        )
    )
    job = wait_for_end(client, job_id)
    assert job.status == JobStatus.FINISHED and job.restarts == 0, job.reason
    deployed = [
        (f.taskmanager, f.slot)
        for f in job_facts(log, job_id)
        if isinstance(f, UpdateTaskExecutionState) and f.state == TaskState.DEPLOYING
    ]
    assert deployed == [(tm, 0)]


@pytest.mark.timeout(SPARK_START + 30 + 120 + 20 + 120 + 20 + MARGIN + TEARDOWN)
def test_a_code_blob_gone_before_deployment_fails_the_library_cache_step_and_leaves_the_taskmanager_clean(
    procs: Processes, log: EventLog, cluster: dict, spark_remote: str, tmp_path: Path
) -> None:
    client = Client(log)
    text = write_lines(tmp_path / "in.txt", 50)
    job_file = load_job(
        JOBS / "lines.py",
        {"input": str(text), "output": str(tmp_path / "out"), "parallelism": "1", "attempts": str(ATTEMPTS)},
    )
    job_id = client.submit(job_file)
    # Accepted with its code in Redis (the JobManager checks), then waiting: no TaskManager yet.
    wait_until(
        lambda: any(isinstance(f, JobWaitingForSlots) for f in job_facts(log, job_id)), "the job to wait", timeout=30
    )
    assert log.client.delete(log.keys.blob(job_file.digest)) == 1
    start_tm(procs, cluster, "tm-1", slots=1)
    job = wait_for_end(client, job_id)
    failed_ms = entry_ms(log.last_id(log.keys.facts(log.keys.job(job_id))))
    assert_failed_at_start(
        log,
        job_id,
        job,
        "tm-1",
        "library cache",
        f"ServiceError: the job's code (blob {job_file.digest[:12]}) is not in Redis",
    )
    assert_start_failure_logged(procs, "tm-1", "library cache", [])
    # Clean: nothing fetched into the library cache, no temp directory, the slot free.
    home = cluster["home"]
    assert not (home / "cache" / job_file.digest).exists()
    assert not list((home / "cache").glob("**/*.tmp"))
    temp_root = home / "tmp" / "tm-1"
    assert not temp_root.exists() or list(temp_root.iterdir()) == []
    assert_slot_free_again(log, "tm-1", 1, failed_ms)
    # The same job file again (its code back in Redis) runs on the very slot.
    run_later_job(log, client, tmp_path, "tm-1", "later")
    assert not temp_root.exists() or list(temp_root.iterdir()) == []


@pytest.mark.timeout(SPARK_START + 120 + 20 + 120 + MARGIN + TEARDOWN)  # the job, a beat, the next job
def test_a_temp_root_that_cannot_be_created_fails_the_temp_files_step_and_undoes_the_steps_before(
    procs: Processes, log: EventLog, cluster: dict, spark_remote: str, tmp_path: Path
) -> None:
    # The TaskManager's temp root (<home>/tmp/<resource id>) is a file: no directory can be
    # made there (a permission bit would not stop root, who runs these tests in CI).
    temp_root = cluster["home"] / "tmp" / "tm-t"
    temp_root.parent.mkdir(parents=True)
    temp_root.write_text("in the way")
    start_tm(procs, cluster, "tm-t", slots=1)
    client = Client(log)
    text = write_lines(tmp_path / "in.txt", 50)
    job_id = client.submit(
        load_job(
            JOBS / "lines.py",
            {"input": str(text), "output": str(tmp_path / "out"), "parallelism": "1", "attempts": str(ATTEMPTS)},
        )
    )
    job = wait_for_end(client, job_id)
    failed_ms = entry_ms(log.last_id(log.keys.facts(log.keys.job(job_id))))
    assert_failed_at_start(
        log, job_id, job, "tm-t", "temp files", f"FileExistsError: [Errno 17] File exists: '{temp_root}'"
    )
    assert_start_failure_logged(
        procs, "tm-t", "temp files", ["result partitions", "split provider", "task table", "library cache"]
    )
    assert_slot_free_again(log, "tm-t", 1, failed_ms)
    # With the way cleared, the next job runs on the same slot and leaves no temp directory.
    temp_root.unlink()
    run_later_job(log, client, tmp_path, "tm-t", "later")
    assert list(temp_root.iterdir()) == []
