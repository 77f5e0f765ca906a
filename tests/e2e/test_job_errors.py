"""Bad input around jobs gets a clear error and loses nothing: job files that cannot be
loaded, bad parameters, inputs that do not exist, unknown jobs, wrong messages in a job inbox."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.client import Client, JobRefusedError, load_job
from sluice.errors import ConfigError
from sluice.events import PROTOCOL_VERSION, RegisterTaskManager
from sluice.store import EventLog
from tests.e2e.conftest import MARGIN, TEARDOWN, Processes, wait_until
from tests.helpers import env

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "source, says, line",
    [
        (None, "does not exist", None),
        ("x = 1\n", "must define a function job(params)", None),
        ("def job(params):\n    return 42\n", "returned int, not a JobGraph (call .graph())", None),
        ("import no_such_module_here\n", "cannot be imported: ModuleNotFoundError", 1),
        ("x = 1\ny = x / 0\n", "cannot be imported: ZeroDivisionError: division by zero", 2),
        (
            "def job(params):\n    return params['input']\n",
            "job(params) in {path} raised KeyError: 'input' (params: {{}})",
            2,
        ),
    ],
)
def test_job_files_that_cannot_be_loaded_say_why(
    tmp_path: Path, source: str | None, says: str, line: int | None
) -> None:
    path = tmp_path / "job.py"
    if source is not None:
        path.write_text(source)
    with pytest.raises(ConfigError) as info:
        load_job(path)
    message = str(info.value)
    assert says.format(path=path) in message
    if line is not None:  # where in the job file it went wrong, without Sluice's frames
        assert f'File "{path}", line {line}' in message and "internal frame" in message
        assert "client.py" not in message and "library.py" not in message


def sluice(cwd: Path, *args: str, extra: dict | None = None) -> subprocess.CompletedProcess:
    env_ = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")} | (extra or {})
    return subprocess.run(
        [sys.executable, "-m", "sluice", *args],
        cwd=cwd,
        env=env_,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.timeout(120 + MARGIN)  # the command
def test_a_malformed_param_is_named(tmp_path: Path) -> None:
    proc = sluice(tmp_path, "run", str(ROOT / "examples" / "wordcount.py"), "-p", "novalue")
    assert proc.returncode == 1 and "--param 'novalue' must look like key=value" in proc.stderr


@pytest.mark.timeout(2 * 120 + MARGIN)  # two commands
def test_an_unknown_job_is_job_not_found(tmp_path: Path, redis_url: str, prefix: str) -> None:
    for args in (["status", "nosuchjob"], ["cancel", "nosuchjob"]):
        proc = sluice(tmp_path, "--redis", redis_url, "--prefix", prefix, *args)
        assert proc.returncode == 1 and "job not found: nosuchjob" in proc.stderr


@pytest.mark.timeout(30 + MARGIN + TEARDOWN)  # the refusal
def test_a_job_whose_input_is_missing_is_refused_with_the_path(procs: Processes, log: EventLog, tmp_path: Path) -> None:
    procs.start("jm", "jobmanager", "--storage-root", (tmp_path / "s").as_uri())
    client = Client(log)
    missing = tmp_path / "nowhere.txt"
    job_id = client.submit(
        load_job(ROOT / "examples" / "wordcount.py", {"input": str(missing), "output": str(tmp_path / "o")})
    )
    with pytest.raises(JobRefusedError) as info:
        client.wait_accepted(job_id, timeout=30)
    assert str(missing) in str(info.value) and f"job {job_id} was refused" in str(info.value)
    assert job_id not in client.job_ids()


@pytest.mark.timeout(20 + 20 + 20 + MARGIN + TEARDOWN)  # acceptance, dead letters, cancel
def test_a_message_a_job_inbox_does_not_take_is_parked_and_the_job_goes_on(
    procs: Processes, log: EventLog, tmp_path: Path
) -> None:
    procs.start("jm", "jobmanager", "--storage-root", (tmp_path / "s").as_uri())
    text = tmp_path / "in.txt"
    text.write_text("a b\n")
    client = Client(log)
    job_id = client.submit(
        load_job(ROOT / "examples" / "wordcount.py", {"input": str(text), "output": str(tmp_path / "o")})
    )
    wait_until(lambda: client.job(job_id, missing_ok=True), "the job to be accepted")
    inbox = log.keys.inbox(log.keys.job(job_id))
    log.append(inbox, env(RegisterTaskManager("tm", "s", "h", 1, PROTOCOL_VERSION, 1)))
    log.client.xadd(inbox, {b"e": b"garbage"})
    dead = wait_until(
        lambda: len(d := list(log.replay_raw(log.keys.dead(log.keys.job(job_id))))) == 2 and d, "two dead letters"
    )
    reasons = [f[b"reason"].decode() for _, f in dead]
    assert any("RegisterTaskManager is not a message a job inbox takes" in r for r in reasons)
    assert any("unexpected character" in r for r in reasons)
    client.cancel(job_id)  # the job still answers
    wait_until(lambda: client.job(job_id).status.value == "CANCELED", "the job to be cancelled")
