"""Starting a task on a TaskManager (FLINK-1672): every step failing in turn, with the
steps before it undone in reverse, on real Redis (code blobs, RQ queue) and real files."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from rq import Queue
from rq.serializers import JSONSerializer

from sluice.events import TaskDeploymentDescriptor, TaskOutput, TaskSource
from sluice.services.taskmanager.library import LibraryCache
from sluice.services.taskmanager.tasks import Step, Task, TaskStartFailed, TaskTable, release, standard_steps, start
from sluice.store import Blobs, EventLog

STEPS = ["library cache", "task table", "split provider", "result partitions", "temp files", "launch"]


class Env:
    def __init__(self, log: EventLog, tmp: Path) -> None:
        self.blob = Blobs(log).put(b"def f(df):\n    return df\n")
        self.library = LibraryCache(Blobs(log), tmp / "cache")
        self.table = TaskTable()
        self.temp_root = tmp / "tmp"
        self.queue = Queue(f"{log.keys.prefix}.test", connection=log.client, serializer=JSONSerializer)
        self.out = tmp / "storage" / "job" / "v" / "0" / "0"
        self.steps = standard_steps(self.library, self.table, self.temp_root, self.launch, self.cancel)

    def launch(self, task: Task) -> str:
        return self.queue.enqueue("builtins.print", args=("hi",)).id

    def cancel(self, task: Task) -> None:
        from rq.job import Job

        Job.fetch(task.rq_job, connection=self.queue.connection).cancel()

    def task(self) -> Task:
        return Task(
            TaskDeploymentDescriptor(
                "job",
                "v:0:0",
                "v",
                0,
                0,
                1,
                128,
                "source",
                self.blob,
                "m",
                [],
                {},
                [],
                output=TaskOutput(self.out.as_uri(), None, 1),
                source=TaskSource("text", {}, "input-splits"),
            ),
            slot=0,
        )

    def assert_clean(self) -> None:
        assert self.library.refs == {}
        assert dict(self.table) == {}
        assert not self.out.exists()
        assert not self.temp_root.exists() or list(self.temp_root.iterdir()) == []
        assert self.queue.count == 0


def test_the_steps_are_flinks_in_order(log: EventLog, tmp_path: Path) -> None:
    assert [s.name for s in Env(log, tmp_path).steps] == STEPS


@pytest.mark.parametrize("failing", range(len(STEPS)))
def test_when_step_k_fails_steps_before_it_are_undone_in_reverse(log: EventLog, tmp_path: Path, failing: int) -> None:
    env = Env(log, tmp_path)

    def boom(task: Task) -> None:
        raise OSError(f"disk full at {STEPS[failing]}")

    steps = [Step(s.name, boom, s.undo) if i == failing else s for i, s in enumerate(env.steps)]
    task = env.task()
    with pytest.raises(TaskStartFailed) as info:
        start(task, steps)
    assert info.value.step == STEPS[failing]
    assert f"step '{STEPS[failing]}': OSError: disk full" in str(info.value)
    assert task.undone == list(reversed(STEPS[:failing]))
    env.assert_clean()


def test_a_started_task_holds_everything_until_released(log: EventLog, tmp_path: Path) -> None:
    env = Env(log, tmp_path)
    task = env.task()
    start(task, env.steps)
    assert env.library.refs == {env.blob: 1} and task.code_path.read_bytes().startswith(b"def f")
    assert env.table == {"job/v:0:0": task} and task.splits == ["input-splits"]
    assert task.temp_dir.is_dir() and env.queue.count == 1
    with pytest.raises(TaskStartFailed, match="slot 0 is busy"):
        start(Task(replace(task.descriptor, execution_id="v:1:0"), slot=0), env.steps)
    release(task, env.steps, keep_output=True)  # FINISHED: its result partition stays for consumers
    assert env.library.refs == {} and dict(env.table) == {} and not task.temp_dir
    assert env.out.parent.exists()


def test_a_missing_code_blob_fails_the_first_step(log: EventLog, tmp_path: Path) -> None:
    env = Env(log, tmp_path)
    task = env.task()
    task.descriptor = replace(task.descriptor, code_blob="0" * 64)
    with pytest.raises(TaskStartFailed, match="library cache.*is not in Redis"):
        start(task, env.steps)
    env.assert_clean()


def test_a_source_with_an_unknown_split_protocol_does_not_start(log: EventLog, tmp_path: Path) -> None:
    env = Env(log, tmp_path)
    task = env.task()
    task.descriptor = replace(task.descriptor, source=replace(task.descriptor.source, protocol="carrier-pigeon"))
    with pytest.raises(TaskStartFailed, match="protocol 'carrier-pigeon'"):
        start(task, env.steps)
    assert task.undone == ["task table", "library cache"]
    env.assert_clean()
