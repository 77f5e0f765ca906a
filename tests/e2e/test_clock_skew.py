"""Skewed and stepped wall clocks, end to end: real Redis, real processes, real Spark (the
session's Spark Connect server), each skewed process under Debian's libfaketime
(``LD_PRELOAD``), its wall clock off as NTP would leave a host's, its monotonic clock true
(``FAKETIME_DONT_FAKE_MONOTONIC``). Only Sluice's processes (and the workers a TaskManager
starts) are preloaded; Spark's JVM is the shared server's, not preloaded.

libfaketime 0.9.10 with ``FAKETIME_DONT_FAKE_MONOTONIC`` makes ``time.sleep`` fail with
EINVAL (its clock_nanosleep on CLOCK_MONOTONIC); the processes here wait on events and
blocking reads, which work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sluice.events import JobStatus, TaskManagerLost, TaskRestartScheduled, TaskState, UpdateTaskExecutionState
from sluice.store import EventLog
from tests.e2e.conftest import (
    MARGIN,
    SLACK,
    SPARK_START,
    TEARDOWN,
    Processes,
    entry_ms,
    facts,
    registered,
    start_tm,
    wait_until,
)
from tests.e2e.test_jobs import JOBS, ROOT, job_facts, run_job, write_lines

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
SKEW_S = 30

pytestmark = pytest.mark.skipif(
    not LIBFAKETIME.exists(), reason=f"{LIBFAKETIME} is missing: install Debian's faketime package"
)


def skewed(offset_s: int) -> dict[str, str]:
    """The environment of a process whose wall clock is ``offset_s`` off (its monotonic clock true)."""
    return {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": f"{offset_s:+d}s", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


def registration_skew_ms(log: EventLog, rid: str) -> int:
    """How far ahead of the Redis server's clock the TaskManager stamped its registration."""
    inbox = log.keys.inbox(log.keys.cluster)
    return next(
        env.ts - entry_ms(i)
        for i, env in log.replay(inbox)
        if env.type == "RegisterTaskManager" and env.event.resource_id == rid
    )


@pytest.mark.longer  # 10-30 s: run by CI in its own step (pytest -m longer)
@pytest.mark.timeout(SPARK_START + 90 + 180 + MARGIN + TEARDOWN)  # registration, the job
def test_taskmanagers_30_s_ahead_and_behind_run_a_job_to_the_end_with_no_loss_and_no_restart(
    procs: Processes, log: EventLog, cluster: dict, tmp_path: Path
) -> None:
    start_tm(procs, cluster, "tm-ahead", env=skewed(SKEW_S))
    start_tm(procs, cluster, "tm-behind", env=skewed(-SKEW_S))
    wait_until(lambda: registered(log) == {"tm-ahead", "tm-behind"}, "both TaskManagers", timeout=90)
    # Their clocks are off as meant (the registrations' stamps against Redis's clock).
    assert abs(registration_skew_ms(log, "tm-ahead") - SKEW_S * 1000) < 5_000
    assert abs(registration_skew_ms(log, "tm-behind") + SKEW_S * 1000) < 5_000
    text = write_lines(tmp_path / "in.txt")
    job_id, job = run_job(
        log,
        ROOT / "examples" / "wordcount.py",
        {"input": str(text), "output": str(tmp_path / "out"), "parallelism": "4", "split_bytes": "4096"},
        timeout=180,
    )
    assert job.status == JobStatus.FINISHED, job.reason
    lost = [env.event for env in facts(log) if isinstance(env.event, TaskManagerLost)]
    assert lost == []
    job_log = job_facts(log, job_id)
    assert not [f for f in job_log if isinstance(f, TaskRestartScheduled)]
    assert job.restarts == 0
    placed = {
        f.taskmanager for f in job_log if isinstance(f, UpdateTaskExecutionState) and f.state == TaskState.SCHEDULED
    }
    assert placed == {"tm-ahead", "tm-behind"}  # both skewed hosts ran subtasks


RESTART_DELAY_MS = 20_000
STEP_S = 60


@pytest.mark.longer  # 10-30 s: run by CI in its own step (pytest -m longer)
@pytest.mark.timeout(SPARK_START + 90 + 240 + MARGIN + TEARDOWN)  # registration, the job (a restart's delay in it)
def test_a_leader_whose_clock_steps_forward_waits_out_a_restarts_delay(
    procs: Processes, log: EventLog, spark_remote: str, tmp_path: Path
) -> None:
    """The leader's wall clock steps a minute forward right after it scheduled a restart 20 s
    later: the next attempt still waits its 20 s (on the Redis server's clock, which did not
    step). On the wall clock, the step started it at once."""
    home, clock = tmp_path / "home", tmp_path / "leader-clock"
    clock.write_text("+0s")
    stepping = {
        "LD_PRELOAD": str(LIBFAKETIME),
        "FAKETIME_TIMESTAMP_FILE": str(clock),
        "FAKETIME_CACHE_DURATION": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
    procs.start(
        "jm",
        "jobmanager",
        "--storage-root",
        (tmp_path / "storage").as_uri(),
        env={"SLUICE_HOME": str(home), **SLACK, **stepping},
    )
    cluster = {"home": home, "spark": spark_remote}
    start_tm(procs, cluster, "tm-1", env={"SLUICE_TEST_FAIL_ONCE": str(tmp_path / "failed-once")})
    wait_until(lambda: registered(log) == {"tm-1"}, "the TaskManager", timeout=90)
    text = write_lines(tmp_path / "in.txt")
    params = {
        "input": str(text),
        "output": str(tmp_path / "out"),
        "restart_delay_ms": str(RESTART_DELAY_MS),
        "queryable": "no",
    }
    from sluice.client import Client, load_job

    client = Client(log)
    job_id = client.submit(load_job(JOBS / "flaky_wordcount.py", params))

    def restart() -> Any:
        return next(
            (
                (i, env)
                for i, env in log.replay(log.keys.facts(log.keys.job(job_id)))
                if isinstance(env.event, TaskRestartScheduled)
            ),
            None,
        )

    at, scheduled = wait_until(restart, "the restart scheduled", timeout=120)
    clock.write_text(f"+{STEP_S}s")  # an NTP step, right after the restart was scheduled
    job = wait_until(
        lambda: (
            (j := client.job(job_id, missing_ok=True)) is not None
            and j.status in (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.CANCELED)
            and j
        ),
        "the job to end",
        timeout=120,
    )
    assert job.status == JobStatus.FINISHED, job.reason
    assert job.restarts == 1
    ev = scheduled.event
    again = next(
        i
        for i, env in log.replay(log.keys.facts(log.keys.job(job_id)))
        if isinstance(env.event, UpdateTaskExecutionState)
        and env.event.state == TaskState.SCHEDULED
        and (env.event.vertex_id, env.event.subtask, env.event.attempt) == (ev.vertex_id, ev.subtask, ev.attempt)
    )
    waited = entry_ms(again) - entry_ms(at)  # on the Redis server's clock
    assert waited >= RESTART_DELAY_MS - 1_000, f"the restart's next attempt was scheduled after {waited} ms"
    # The step did show: the leader stamped facts after it a minute ahead of the server.
    assert max(env.ts - entry_ms(i) for i, env in log.replay(log.keys.facts(log.keys.job(job_id)))) > 30_000
    assert [env.event for env in facts(log) if isinstance(env.event, TaskManagerLost)] == []
