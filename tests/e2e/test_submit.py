"""``sluice submit`` on real processes: it returns once a JobManager accepted the job (not
when its tasks run), says why when it is refused or no JobManager answers, and waits for
more only when asked (``--wait-running``, ``--wait``). No-op jobs: no Spark."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.client import Client
from sluice.events import JobStatus, TaskState, UpdateTaskExecutionState
from sluice.store import EventLog
from tests.e2e.conftest import MARGIN, TEARDOWN, Processes, wait_until

ROOT = Path(__file__).resolve().parents[2]

NOOP = """from sluice.api import Job


def job(params):
    j = Job("noops")
    j.noop("noop", parallelism=int(params["n"]))
    return j.graph()
"""


def start_submit(redis_url: str, prefix: str, tmp_path: Path, *args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    return subprocess.Popen(
        [sys.executable, "-m", "sluice", "--redis", redis_url, "--prefix", prefix, "submit", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def submit(redis_url: str, prefix: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return finish(start_submit(redis_url, prefix, tmp_path, *args))


def task_updates(log: EventLog, job_id: str) -> list[UpdateTaskExecutionState]:
    return [
        e.event
        for _, e in log.replay(log.keys.facts(log.keys.job(job_id)))
        if isinstance(e.event, UpdateTaskExecutionState)
    ]


@pytest.mark.timeout(4 * 120 + 20 + MARGIN + TEARDOWN)  # four rounds of commands, the first job's end
def test_submit_returns_on_acceptance_and_waits_for_more_only_when_asked(
    procs: Processes, log: EventLog, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    noop = tmp_path / "noop.py"
    noop.write_text(NOOP)
    lines = ROOT / "tests" / "e2e" / "jobs" / "lines.py"

    nobody = submit(redis_url, prefix, tmp_path, str(noop), "-p", "n=3", "--timeout", "1")
    assert nobody.returncode == 1 and nobody.stdout == ""
    assert "no JobManager accepted or refused job" in nobody.stderr and "within 1 s" in nobody.stderr

    procs.start("jm", "jobmanager", "--storage-root", (tmp_path / "s").as_uri())
    # Three at once (each command's start-up is most of its time).
    started = [
        start_submit(
            redis_url,
            prefix,
            tmp_path,
            str(lines),
            "-p",
            f"input={tmp_path / 'nowhere.txt'}",
            "-p",
            f"output={tmp_path / 'o'}",
        ),
        start_submit(redis_url, prefix, tmp_path, str(noop), "-p", "n=3"),
        start_submit(redis_url, prefix, tmp_path, str(noop), "-p", "n=3", "--wait-running", "--timeout", "2"),
    ]
    refused, accepted, stuck = (finish(p) for p in started)
    assert refused.returncode == 1 and "was refused" in refused.stderr and "nowhere.txt" in refused.stderr

    # No TaskManager: the job is accepted but nothing can run; submit returns all the same.
    assert accepted.returncode == 0, accepted.stderr
    job_id = accepted.stdout.strip()
    assert log.last_id(log.keys.facts(log.keys.job(job_id))) is not None  # its ExecutionGraph exists
    assert task_updates(log, job_id) == []
    # ... and --wait-running waits on, until its timeout.
    assert stuck.returncode == 1 and "was accepted but its sources do not all run after 2 s" in stuck.stderr

    procs.start("tm-1", "taskmanager", "--resource-id", "tm-1", "--slots", "1")
    running = submit(redis_url, prefix, tmp_path, str(noop), "-p", "n=3", "--wait-running")
    assert running.returncode == 0, running.stderr
    assert any(u.state == TaskState.RUNNING for u in task_updates(log, running.stdout.strip()))

    # 5 subtasks through 1 slot: --wait follows the job to its end and exits with its status.
    ended = submit(redis_url, prefix, tmp_path, str(noop), "-p", "n=5", "--wait")
    assert ended.returncode == 0, ended.stderr + ended.stdout
    waited = ended.stdout.splitlines()[0]
    assert f"job {waited} (noops): FINISHED" in ended.stdout and "noop: 5 FINISHED" in ended.stdout
    assert sum(u.state == TaskState.FINISHED for u in task_updates(log, waited)) == 5
    # The first job, accepted while no TaskManager was there, runs now too.
    assert wait_until(lambda: Client(log).job(job_id).status == JobStatus.FINISHED, "the first job to finish")
