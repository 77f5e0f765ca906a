"""The broadcast limit at a consumer's deployment (issue 32), on real files without Spark:
the producer's published data files are added up (not its ``_schema.json`` or markers),
once a partition, and above the limit the error names the vertices, the sizes and the fix."""

from __future__ import annotations

from pathlib import Path

from sluice.errors import BroadcastTooLarge
from sluice.events import ProducerPartitions, TaskDeploymentDescriptor, TaskInput
from sluice.services.taskmanager.inputs import broadcast_problem


def publish(root: Path, subtask: int, sizes: list[int], keyed: bool = False) -> None:
    part = root / str(subtask) / "0"
    part.mkdir(parents=True)
    for i, size in enumerate(sizes):
        where = part / f"_kg={i}" if keyed else part
        where.mkdir(exist_ok=True)
        (where / f"part-{i:05d}.parquet").write_bytes(b"x" * size)
    (part / "_schema.json").write_bytes(b"{}" * 1000)  # not data
    (part / "_SUCCESS").write_bytes(b"")
    (part / ".part-00000.parquet.crc").write_bytes(b"c" * 1000)


def consumer(root: Path, subtasks: int, limit: int | None) -> TaskDeploymentDescriptor:
    planes = ProducerPartitions(str(root) + "/{subtask}/{attempt}", subtasks, {})
    return TaskDeploymentDescriptor(
        "j",
        "enrich:0:0",
        "enrich",
        0,
        0,
        2,
        128,
        "transform",
        "0" * 64,
        "m",
        [],
        {},
        [
            TaskInput(paths=[str(root / "flights")], vertex="flights"),
            TaskInput(producer=planes, consumer=0, vertex="planes", broadcast_limit=limit),
        ],
    )


def test_the_producers_data_files_are_added_up_against_the_limit(tmp_path: Path) -> None:
    root = tmp_path / "planes"
    publish(root, 0, [600, 400])
    publish(root, 1, [300, 200], keyed=True)  # a keyed producer's partitions count whole too
    assert broadcast_problem(consumer(root, 2, 1500)) is None  # 1500 bytes of data: at the limit
    too_large = broadcast_problem(consumer(tmp_path / "planes", 2, 1499))
    assert isinstance(too_large, BroadcastTooLarge)
    assert str(too_large) == (
        "broadcast input 'planes' of vertex 'enrich' published 1.5 KiB (1500 bytes), above the job's broadcast "
        "limit of 1.5 KiB (1499 bytes): every subtask of 'enrich' would read it whole; key both sides instead "
        "(a.key_by(k).join(b.key_by(k), ...)), or raise the limit with Job(..., broadcast_limit_bytes=N)"
    )
    assert broadcast_problem(consumer(root, 2, None)) is None  # not a broadcast: nothing to check


def test_a_partition_that_cannot_be_listed_is_left_to_the_tasks_own_read(tmp_path: Path) -> None:
    assert broadcast_problem(consumer(tmp_path / "nowhere", 2, 10)) is None
