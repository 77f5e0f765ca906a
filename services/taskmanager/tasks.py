"""Starting a task on a TaskManager, step by step, each step with its undo (FLINK-1672).

When step k fails, steps k-1 … 1 are undone in reverse and the task is reported FAILED
with the cause; when a task ends, what it held is released the same way (its result
partition stays if it FINISHED: consumers read it).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from sluice.errors import TaskStartFailed
from sluice.events import TaskDeploymentDescriptor

from .library import LibraryCache

__all__ = ["Task", "TaskStartFailed", "Step", "start", "standard_steps", "local_path", "TaskTable"]


def local_path(uri: str) -> Path:
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return Path(parsed.path if parsed.scheme else uri)
    raise ValueError(f"{uri!r}: only file:// storage roots can be managed by the TaskManager for now")


@dataclass
class Task:
    """One execution attempt on this TaskManager, and what it holds."""

    descriptor: TaskDeploymentDescriptor
    slot: int
    code_path: Path | None = None
    splits: list[Any] | None = None
    output_dir: Path | None = None
    temp_dir: Path | None = None
    rq_job: str | None = None
    undone: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.descriptor.task_id


class TaskTable(dict[str, Task]):
    """Running tasks by id; a slot runs one task at a time."""

    def slot_busy(self, slot: int) -> Task | None:
        return next((t for t in self.values() if t.slot == slot), None)


@dataclass(frozen=True)
class Step:
    name: str
    do: Callable[[Task], None]
    undo: Callable[[Task], None]


def start(task: Task, steps: list[Step], on_undo_error: Callable[[str, BaseException], None] | None = None) -> None:
    """Run ``steps`` in order; if one raises, undo the ones done, last first, and raise.
    (Only errors: an interrupt or a process being stopped is not a failed start.)"""
    done: list[Step] = []
    for step in steps:
        try:
            step.do(task)
        except Exception as exc:
            for d in reversed(done):
                try:
                    d.undo(task)
                    task.undone.append(d.name)
                except Exception as undo_exc:  # keep undoing the rest
                    if on_undo_error:
                        on_undo_error(d.name, undo_exc)
            raise TaskStartFailed(step.name, exc) from exc
        done.append(step)


def standard_steps(
    library: LibraryCache,
    table: TaskTable,
    temp_root: Path,
    launch: Callable[[Task], str],
    cancel_launch: Callable[[Task], None],
) -> list[Step]:
    """The TaskManager's steps to start a task, in Flink's order."""

    def library_do(t: Task) -> None:
        t.code_path = library.register(t.descriptor.code_blob, t.descriptor.module)

    def library_undo(t: Task) -> None:
        library.release(t.descriptor.code_blob)
        t.code_path = None

    def table_do(t: Task) -> None:
        busy = table.slot_busy(t.slot)
        if busy is not None:
            raise RuntimeError(f"slot {t.slot} is busy with {busy.id}")
        if t.id in table:
            raise RuntimeError(f"{t.id} is already running here")
        table[t.id] = t

    def table_undo(t: Task) -> None:
        table.pop(t.id, None)

    def splits_do(t: Task) -> None:
        # The split provider: a source asks its coordinator for splits as it goes, by the
        # protocol its descriptor names (the task's inbox is where the answers arrive).
        source = t.descriptor.source
        if source is not None:
            protocol = source.protocol
            if protocol not in ("operator-events", "input-splits"):
                raise ValueError(
                    f"the descriptor asks for splits by protocol {protocol!r}; this TaskManager "
                    "speaks operator-events and input-splits"
                )
            t.splits = [protocol]

    def splits_undo(t: Task) -> None:
        t.splits = None

    def partitions_do(t: Task) -> None:
        output = t.descriptor.output
        if output:
            path = local_path(output.path)
            if path.exists():
                shutil.rmtree(path)  # what an earlier try of this very attempt left
            path.parent.mkdir(parents=True, exist_ok=True)
            t.output_dir = path

    def partitions_undo(t: Task) -> None:
        if t.output_dir is not None:
            shutil.rmtree(t.output_dir, ignore_errors=True)
            t.output_dir = None

    def temp_do(t: Task) -> None:
        if t.descriptor.kind == "noop":  # runs nothing, writes nothing: a directory to make and
            return  # delete would cost a no-op task a third of its TaskManager's CPU (bench tasks)
        temp_root.mkdir(parents=True, exist_ok=True)
        t.temp_dir = Path(
            tempfile.mkdtemp(prefix=str(t.descriptor.execution_id).replace(":", "_") + "-", dir=temp_root)
        )

    def temp_undo(t: Task) -> None:
        if t.temp_dir is not None:
            shutil.rmtree(t.temp_dir, ignore_errors=True)
            t.temp_dir = None

    def launch_do(t: Task) -> None:
        t.rq_job = launch(t)

    def launch_undo(t: Task) -> None:
        cancel_launch(t)
        t.rq_job = None

    return [
        Step("library cache", library_do, library_undo),
        Step("task table", table_do, table_undo),
        Step("split provider", splits_do, splits_undo),
        Step("result partitions", partitions_do, partitions_undo),
        Step("temp files", temp_do, temp_undo),
        Step("launch", launch_do, launch_undo),
    ]


def release(task: Task, steps: list[Step], *, keep_output: bool) -> None:
    """A task ended: give back what its start took (all but launch, which is over)."""
    for step in reversed(steps):
        if step.name == "launch" or (keep_output and step.name == "result partitions"):
            continue
        try:
            step.undo(task)
        except Exception:
            pass
