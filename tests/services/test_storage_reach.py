"""A job whose storage root or inputs a TaskManager cannot see fails at once, naming the host
and the path: the marker the leader writes, the TaskManager's check of it (once per job),
and the jobs core failing the job without a restart (replayed state equal to live)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sluice.errors import StorageUnreachable
from sluice.events import (
    JobStatus,
    RestartStrategy,
    TaskDeploymentDescriptor,
    TaskOperationResult,
    TaskRestartScheduled,
    TaskState,
)
from sluice.services.common import job_marker
from sluice.services.taskmanager.reach import Reach
from tests.cores import JobsDriven
from tests.services.test_jobs_core import wordcount

ADVICE = "every TaskManager must reach the same storage root and inputs"


# --- the jobs core -------------------------------------------------------------------------------


def test_a_start_that_is_not_retryable_fails_the_job_at_once_without_a_restart() -> None:
    sim = JobsDriven(wordcount(RestartStrategy("fixed-delay", 3, 100)), {"tm-a": 4})
    first, second = sim.schedule()
    assert first.descriptor.storage_root == "file:///s"  # what the TaskManager checks
    why = "TaskManager tm-a on host h1 cannot see the storage root file:///s (marker /s/j1/_SLUICE_JOB missing)"
    d = sim.tell(TaskOperationResult("j1", first.execution_id, False, why, retryable=False))
    assert not [f for f in d.facts if isinstance(f, TaskRestartScheduled)]
    assert sim.job.status == JobStatus.FAILING and sim.job.restarts == 0
    assert sim.job.vertices[first.vertex_id].subtasks[0].state == TaskState.FAILED
    sim.report(second, TaskState.CANCELED)  # the other source was cancelled
    assert sim.job.status == JobStatus.FAILED
    assert sim.job.reason == f"task lines -> tokenize[0] failed (no restart): deployment failed on tm-a: {why}"
    replayed = sim.replayed().jobs["j1"]
    assert (replayed.status, replayed.reason, replayed.restarts) == (sim.job.status, sim.job.reason, 0)


def test_a_start_that_is_retryable_is_restarted_as_before() -> None:
    sim = JobsDriven(wordcount(RestartStrategy("fixed-delay", 3, 100)), {"tm-a": 4})
    first, _ = sim.schedule()
    d = sim.tell(TaskOperationResult("j1", first.execution_id, False, "starting the task failed at step 'temp files'"))
    assert [f.attempt for f in d.facts if isinstance(f, TaskRestartScheduled)] == [1]
    assert sim.job.status == JobStatus.CREATED


# --- the marker ----------------------------------------------------------------------------------


def _inputs(tmp_path: Path) -> list[str]:
    text = tmp_path / "in" / "a.txt"
    text.parent.mkdir()
    text.write_text("a b\n")
    return [str(text)]


def test_a_taskmanager_that_sees_the_marker_and_the_inputs_may_run_the_job(tmp_path: Path) -> None:
    root = (tmp_path / "storage").as_uri()
    inputs = _inputs(tmp_path)
    path = job_marker.write(root, "j1", inputs, "jm-host")
    assert path == tmp_path / "storage" / "j1" / "_SLUICE_JOB"
    assert job_marker.write(root, "j1", inputs, "jm-host") == path  # again: the same (a redelivered submission)
    assert job_marker.unreachable(root, "j1", "tm-1", "h1") is None
    assert [p.name for p in path.parent.iterdir()] == ["_SLUICE_JOB"]  # nothing half-written left beside it


def test_a_storage_root_of_its_own_is_named_with_the_host_and_the_marker(tmp_path: Path) -> None:
    job_marker.write((tmp_path / "shared").as_uri(), "j1", [], "jm-host")
    private = (tmp_path / "private").as_uri()  # what a TaskManager sees without the shared mount
    problem = job_marker.unreachable(private, "j1", "tm-x", "h9")
    assert problem is not None and problem.host == "h9"
    assert problem.path == str(tmp_path / "private" / "j1" / "_SLUICE_JOB")
    assert str(problem) == (
        f"TaskManager tm-x on host h9 cannot see the storage root {private} (marker "
        f"{problem.path} missing): {job_marker.ADVICE}"
    )
    assert "README 'Across hosts'" in str(problem)


def test_an_input_a_taskmanager_cannot_see_is_named(tmp_path: Path) -> None:
    root = (tmp_path / "storage").as_uri()
    inputs = _inputs(tmp_path)
    job_marker.write(root, "j1", [*inputs, str(tmp_path / "in" / "b.txt")], "jm-host")
    Path(inputs[0]).unlink()  # (as if it were on a disk of the JobManager's host only)
    problem = job_marker.unreachable(root, "j1", "tm-x", "h9")
    assert problem is not None and problem.path == inputs[0]
    assert f"TaskManager tm-x on host h9 cannot see the input file {inputs[0]}" in str(problem)
    assert "JobManager on host jm-host" in str(problem) and ADVICE in str(problem)


def test_another_jobs_marker_is_not_this_jobs(tmp_path: Path) -> None:
    root = (tmp_path / "storage").as_uri()
    path = job_marker.write(root, "j1", [], "jm-host")
    assert path is not None
    path.write_bytes(b'{"job_id": "j0", "inputs": []}')
    problem = job_marker.unreachable(root, "j1", "tm-x", "h9")
    assert problem is not None and "sees another job's marker" in str(problem) and "'j0'" in str(problem)
    path.write_bytes(b"not json")
    problem = job_marker.unreachable(root, "j1", "tm-x", "h9")
    assert problem is not None and "cannot read the job's marker" in str(problem)


def test_a_leader_that_cannot_write_the_marker_says_where_and_on_which_host(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")  # a storage root under a regular file: no directory can be made there
    with pytest.raises(StorageUnreachable) as info:
        job_marker.write((blocked / "storage").as_uri(), "j1", [], "jm-host")
    message = str(info.value)
    assert message.startswith(
        f"the JobManager on host jm-host cannot write the job's marker {blocked / 'storage' / 'j1' / '_SLUICE_JOB'}"
    )
    assert "--storage-root" in message and info.value.host == "jm-host"


def test_a_root_that_is_not_local_has_no_marker_here(tmp_path: Path) -> None:
    assert job_marker.write("s3://bucket/root", "j1", [], "jm-host") is None
    assert job_marker.unreachable("s3://bucket/root", "j1", "tm-x", "h9") is None


def test_the_input_files_are_every_splits_path_once() -> None:
    splits = {
        "a": [{"path": "/x", "start": 0}, {"path": "/x", "start": 9}, {"path": "/y"}],
        "r": [{"format": "range", "start": 0, "end": 3}],
    }
    assert job_marker.input_paths(splits) == ["/x", "/y"]


# --- the TaskManager's check: once per job -----------------------------------------------------


def test_a_taskmanager_looks_once_per_job_and_remembers_the_answer(tmp_path: Path) -> None:
    root = (tmp_path / "storage").as_uri()
    job_marker.write(root, "job", [], "jm-host")
    d = TaskDeploymentDescriptor(
        "job", "v:0:0", "v", 0, 0, 2, 128, "noop", "0" * 64, "m", [], {}, [], storage_root=root
    )
    paused: list[float] = []
    reach = Reach("tm-1", "h1", settle_s=(0.1, 0.3), sleep=paused.append)
    reach.check(d)
    reach.check(dataclasses.replace(d, execution_id="v:1:0", subtask=1))
    assert reach.looks == 1 and paused == []
    other = dataclasses.replace(d, job_id="job2")
    for _ in range(2):
        with pytest.raises(StorageUnreachable, match="TaskManager tm-1 on host h1 cannot see the storage root"):
            reach.check(other)
    assert reach.looks == 1 + 3 and paused == [0.1, 0.3]  # looked again after each pause, then not again
    reach.check(dataclasses.replace(d, storage_root=""))  # a descriptor of an older leader: not checked
    assert reach.looks == 4


def test_a_marker_that_shows_up_a_moment_late_is_found(tmp_path: Path) -> None:
    """A shared filesystem may show another host's new file late: the TaskManager looks again."""
    root = (tmp_path / "storage").as_uri()
    d = TaskDeploymentDescriptor(
        "job", "v:0:0", "v", 0, 0, 1, 128, "noop", "0" * 64, "m", [], {}, [], storage_root=root
    )

    def pause(seconds: float) -> None:
        if seconds == 0.3:  # it "arrives" during the second pause
            job_marker.write(root, "job", [], "jm-host")

    reach = Reach("tm-1", "h1", settle_s=(0.1, 0.3, 0.6), sleep=pause)
    reach.check(d)
    assert reach.looks == 3


def test_an_io_error_is_not_proof_that_a_host_cannot_see_the_storage(tmp_path: Path, monkeypatch) -> None:
    """EIO or ESTALE from a network filesystem (a mount losing packets) says reaching the file
    failed this time, not that this host has no such file: the check lets the attempt run, and
    it fails and restarts as any attempt would, instead of failing the whole job at once."""
    import errno
    import os

    root = (tmp_path / "storage").as_uri()
    inputs = _inputs(tmp_path)
    marker = job_marker.write(root, "j1", inputs, "jm-host")
    real_read, real_stat = Path.read_bytes, os.stat

    def read_eio(self: Path) -> bytes:
        if self == marker:
            raise OSError(errno.EIO, "Input/output error", str(self))
        return real_read(self)

    monkeypatch.setattr(Path, "read_bytes", read_eio)
    assert job_marker.unreachable(root, "j1", "tm-1", "h1") is None
    monkeypatch.setattr(Path, "read_bytes", real_read)

    def stat_estale(path, *args, **kwargs):
        if str(path) == inputs[0]:
            raise OSError(errno.ESTALE, "Stale file handle", str(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(job_marker.os, "stat", stat_estale)
    assert job_marker.unreachable(root, "j1", "tm-1", "h1") is None
    Path(inputs[0]).unlink()
    monkeypatch.setattr(job_marker.os, "stat", real_stat)
    problem = job_marker.unreachable(root, "j1", "tm-1", "h1")  # truly missing: refused, named
    assert problem is not None and problem.path == inputs[0]
