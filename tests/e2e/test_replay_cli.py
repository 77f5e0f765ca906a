"""``sluice replay`` and ``sluice job export``/``import`` as a user runs them (a process each),
on the log of a job that failed once and ran again (a real JobManager and TaskManager
driven through their step functions on the session's real redis-server)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from sluice.cli.context import Context
from sluice.cli.replay import replay
from sluice.config import Settings
from sluice.services.projector import Projector
from sluice.store import EventLog, Keys, ReadModels
from sluice.views.history import Moment
from sluice.views.replay import rebuild, rebuild_json
from tests.views.test_replay import run_with_a_restart, second_prefix

ROOT = Path(__file__).resolve().parents[2]


def sluice(url: str, prefix: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    return subprocess.run(
        [sys.executable, "-m", "sluice", "--redis", url, "--prefix", prefix, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.timeout(120)
def test_replay_prints_the_past_checks_the_live_tables_and_writes_into_a_fresh_prefix(
    log: EventLog, redis_url: str, tmp_path: Path
) -> None:
    p = log.keys.prefix
    run = run_with_a_restart(log, tmp_path)
    then = sluice(redis_url, p, "replay", "--until", run.mid)
    assert then.returncode == 0, then.stderr
    assert re.search(r"job j1 \(j1\): RUNNING, 0 restart\(s\)", then.stdout)
    assert re.search(r"src/0 +│ 0 +│ RUNNING +│ tm-1", then.stdout) and "TaskManagers" in then.stdout
    # No projector ran yet: every table is behind, none differs.
    behind = sluice(redis_url, p, "replay", "--check")
    assert behind.returncode == 0, behind.stdout + behind.stderr
    assert "job j1 executiongraph: not projected yet" in behind.stdout and "agree" in behind.stdout
    # A row the projector got wrong.
    Projector(log).catch_up()
    Projector(log).catch_up()
    position, rows = ReadModels(log).read(log.keys.job("j1"), "executiongraph")
    ReadModels(log).write(
        log.keys.job("j1"),
        "executiongraph",
        expected=position,
        position=position or "",
        rows={"src/0": dict(rows["src/0"], taskmanager="tm-9")},
    )
    differs = sluice(redis_url, p, "replay", "--check", "--json")
    assert differs.returncode == 1, differs.stderr
    assert orjson.loads(differs.stdout)["differences"] == [
        {
            "scope": "job j1",
            "table": "executiongraph",
            "key": "src/0",
            "field": "taskmanager",
            "live": "tm-9",
            "rebuilt": "tm-1",
        }
    ]
    # Into a fresh prefix: `status` there shows the job as it was.
    with second_prefix(log) as there:
        into = sluice(redis_url, p, "replay", "--until", run.mid, "--into", there.keys.prefix)
        assert into.returncode == 0, into.stderr
        assert f"into prefix {there.keys.prefix!r}" in into.stdout
        status = sluice(redis_url, there.keys.prefix, "status", "j1", "--json")
        assert status.returncode == 0, status.stderr
        job = orjson.loads(status.stdout)
        assert job["status"] == "RUNNING"
        assert [(s["attempt"], s["state"]) for s in job["vertices"][0]["subtasks"]] == [(0, "RUNNING")] * 2


def test_replay_says_what_is_wrong_with_its_options(log: EventLog, redis_url: str) -> None:
    """(In this process: the command alone, with the context ``sluice --redis URL --prefix P`` gives it.)"""
    obj = Context(Settings(redis_url=redis_url, prefix=log.keys.prefix))
    runner = CliRunner()
    bad = runner.invoke(replay, ["--until", "yesterday"], obj=obj)
    assert bad.exit_code == 2 and "Invalid value for --until: 'yesterday' is neither an entry id" in bad.output
    both = runner.invoke(replay, ["--job", "j1", "--cluster"], obj=obj)
    assert both.exit_code == 2 and "--job and --cluster exclude each other" in both.output
    mixed = runner.invoke(replay, ["--check", "--until", "1-0"], obj=obj)
    assert mixed.exit_code == 2 and "--check compares a full rebuild with the live tables" in mixed.output
    missing = runner.invoke(replay, ["--check", "--job", "nope"], obj=obj)
    assert missing.exit_code == 2 and "job 'nope' not found" in missing.output


@pytest.mark.timeout(120)
def test_an_exported_job_imports_under_a_fresh_prefix_where_replay_agrees(
    log: EventLog, redis_url: str, tmp_path: Path
) -> None:
    p = log.keys.prefix
    job_id = "j" + uuid.uuid4().hex[:8]
    run_with_a_restart(log, tmp_path, job_id)
    file = tmp_path / "job.jsonl"
    exported = sluice(redis_url, p, "job", "export", job_id, str(file))
    assert exported.returncode == 0, exported.stderr
    assert f"exported to {file}" in exported.stdout and "1 code blob(s)" in exported.stdout
    prefix = f"import-{job_id}-1"
    with removed_after(EventLog(log.backend, Keys(prefix))) as there:
        imported = sluice(redis_url, p, "job", "import", str(file))
        assert imported.returncode == 0, imported.stderr
        assert f"imported under prefix {prefix!r}" in imported.stdout
        Projector(there).catch_up()
        Projector(there).catch_up()
        agree = sluice(redis_url, prefix, "replay", "--check")
        assert agree.returncode == 0, agree.stdout + agree.stderr
        assert "agree: 5 table(s)" in agree.stdout and "behind" not in agree.stdout
        replayed = sluice(redis_url, prefix, "replay", "--job", job_id, "--json")
        assert (
            orjson.loads(replayed.stdout)["jobs"] == rebuild_json(log, rebuild(log, Moment(None), job=job_id))["jobs"]
        )
        again = sluice(redis_url, p, "job", "import", str(file), "--prefix", prefix)
        assert again.returncode == 1 and f"prefix '{prefix}' is not empty" in again.stderr
    (tmp_path / "notes.txt").write_text("these are not the entries you are looking for\n")
    wrong = sluice(redis_url, p, "job", "import", str(tmp_path / "notes.txt"))
    assert wrong.returncode == 1 and "notes.txt line 1: not a Sluice export" in wrong.stderr


@contextmanager
def removed_after(log: EventLog) -> Iterator[EventLog]:
    """An import's prefix, its keys removed after the test."""
    try:
        yield log
    finally:
        client = log.client
        for key in client.scan_iter(match=log.keys.pattern, count=1000):
            client.delete(key)


def test_export_and_import_say_what_is_wrong(log: EventLog, redis_url: str, tmp_path: Path) -> None:
    """(In this process, as the test above.)"""
    from sluice.cli.job_archive import export_job, import_job
    from sluice.errors import ConfigError, SluiceError

    obj = Context(Settings(redis_url=redis_url, prefix=log.keys.prefix))
    runner = CliRunner()
    unknown = runner.invoke(export_job, ["nope", str(tmp_path / "x.jsonl")], obj=obj)
    assert isinstance(unknown.exception, SluiceError) and "job 'nope' not found" in str(unknown.exception)
    missing = runner.invoke(import_job, [str(tmp_path / "gone.jsonl")], obj=obj)
    assert isinstance(missing.exception, SluiceError)
    assert str(missing.exception) == f"cannot read {tmp_path / 'gone.jsonl'}: No such file or directory"
    (tmp_path / "empty.jsonl").write_text("")
    empty = runner.invoke(import_job, [str(tmp_path / "empty.jsonl"), "--prefix", "a b"], obj=obj)
    assert isinstance(empty.exception, SluiceError) and "empty.jsonl is empty: not a Sluice export" in str(
        empty.exception
    )
    (tmp_path / "one.jsonl").write_text(
        '{"sluice_export": 1, "job_id": "j1", "prefix": "p", "exported_at": 0, '
        '"counts": {"entries": 0, "blobs": 0, "streams": {}}}\n'
    )
    bad_prefix = runner.invoke(import_job, [str(tmp_path / "one.jsonl"), "--prefix", "a b"], obj=obj)
    assert isinstance(bad_prefix.exception, ConfigError) and "key prefix 'a b' is not usable" in str(
        bad_prefix.exception
    )
