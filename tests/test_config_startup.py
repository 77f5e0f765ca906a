"""The start-up rule (issue 33): a process whose home, log folder or file:// storage root it
cannot write exits non-zero at start, naming the path and why, and never loops on it (a
TaskManager in a container logged PermissionError for ever). Real unwritable folders, which
stop root too: a path through a regular file, a folder made immutable (chattr +i), and a
read-only bind mount in a mount namespace of its own (unshare -m). Nothing here reaches
Redis: the check comes first."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from sluice.cli.main import _register, cli
from sluice.errors import ConfigError

_register()

NOWHERE = "redis://127.0.0.1:1"  # never reached: the process stops before it connects
ROLES = {
    "jobmanager": ["jobmanager"],
    "taskmanager": ["taskmanager"],
    "projector": ["projector"],
    "ui": ["ui", "--port", "0"],
    "run": ["run", "JOB"],
    "cluster start": ["cluster", "start", "-n", "0"],
}


def start(tmp_path: Path, role: str, *global_args: str, env: dict[str, str] | None = None) -> BaseException | None:
    job = tmp_path / "job.py"
    job.write_text("")
    args = [a if a != "JOB" else str(job) for a in ROLES[role]]
    result = CliRunner().invoke(cli, ["--redis", NOWHERE, *global_args, *args], env=env or {})
    return result.exception


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "a-file"
    path.write_text("not a folder\n")
    return path


@pytest.mark.parametrize("role", list(ROLES))
def test_a_home_under_a_file_is_refused_at_start(role: str, tmp_path: Path, a_file: Path) -> None:
    error = start(tmp_path, role, "--home", str(a_file / "home"))
    assert isinstance(error, ConfigError), error
    assert str(error).startswith(f"the home {a_file / 'home'} (from --home) is not writable: {a_file} is a file")


@pytest.mark.parametrize("role", list(ROLES))
def test_a_log_folder_that_is_a_file_is_refused_at_start(role: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "logs").write_text("")
    error = start(tmp_path, role, env={"SLUICE_HOME": str(home)})
    assert isinstance(error, ConfigError), error
    assert f"the log folder {home / 'logs'} (in the home, from $SLUICE_HOME) is not writable" in str(error)


@pytest.mark.parametrize("role", ["jobmanager", "run", "cluster start"])
def test_a_storage_root_it_cannot_write_is_refused_at_start(role: str, tmp_path: Path, a_file: Path) -> None:
    root = a_file / "storage"
    error = start(tmp_path, role, "--home", str(tmp_path / "home"), env={"SLUICE_STORAGE_ROOT": root.as_uri()})
    assert isinstance(error, ConfigError), error
    assert str(error).startswith(f"the storage root {root} (from $SLUICE_STORAGE_ROOT) is not writable")
    assert "flag --storage-root of `sluice jobmanager`" in str(error)


@pytest.fixture
def immutable(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "immutable"
    folder.mkdir()
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(folder)]).returncode != 0:
        pytest.skip("chattr +i is not possible here (no chattr, not root, or a file system without the flag)")
    try:
        yield folder
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


def test_an_immutable_home_stops_even_root(tmp_path: Path, immutable: Path) -> None:
    error = start(tmp_path, "taskmanager", "--home", str(immutable))
    assert isinstance(error, ConfigError), error
    assert f"the home {immutable} (from --home) is not writable: Operation not permitted" in str(error)


def test_a_read_only_home_makes_the_process_exit_1_at_once_saying_why(tmp_path: Path) -> None:
    """The container's case, as a real process: a TaskManager whose home is on a read-only
    mount exits 1 with one line naming the folder, instead of logging PermissionError for
    ever (the timeout only keeps a regression from hanging the suite)."""
    home = tmp_path / "ro"
    home.mkdir()
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"]).returncode != 0:
        pytest.skip("no mount namespace can be made here (unshare -m)")
    script = (
        f'mount --bind "{home}" "{home}" && mount -o remount,bind,ro "{home}" && '
        f'exec "{sys.executable}" -m sluice --redis {NOWHERE} --home "{home}" taskmanager'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1, done.stderr
    said = done.stderr
    assert said.startswith(f"error: the home {home} (from --home) is not writable: Read-only file system; "), said
    assert said.count("\n") == 1 and "Traceback" not in said and "PermissionError" not in said
