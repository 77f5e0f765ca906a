"""A task's share of its Spark server (services/taskmanager/share.py): the cores its slot
stands for (all of them for a vertex of one subtask), the cores of a master; what a
TaskManager gives its tasks, and what the embedded cluster tells its TaskManagers."""

from __future__ import annotations

import os

import pytest

from sluice.services.taskmanager.share import local_cores, task_partitions


@pytest.mark.parametrize(
    ("master", "cores"),
    [
        ("local", 1),
        ("local[1]", 1),
        ("local[4]", 4),
        ("local[4,3]", 4),
        (" local[2] ", 2),
        ("local[0]", 1),
        ("local[*]", os.cpu_count() or 1),
        ("local[*, 2]", os.cpu_count() or 1),
    ],
)
def test_a_local_master_names_its_cores(master: str, cores: int) -> None:
    assert local_cores(master) == cores


@pytest.mark.parametrize(
    "master",
    [
        "spark://host:7077",
        "yarn",
        "k8s://https://api:6443",
        "sc://host:15002",
        "local-cluster[2,1,1024]",
        "localhost",
        "",
    ],
)
def test_a_master_whose_cores_this_process_cannot_see_has_none(master: str) -> None:
    assert local_cores(master) is None


@pytest.mark.parametrize(
    ("cores", "slots", "parallelism", "partitions"),
    [
        (8, 2, None, 4),
        (8, 3, None, 2),
        (2, 2, None, 1),
        (2, 4, None, 1),
        (1, 1, None, 1),
        (16, 1, None, 16),
        (8, 0, None, 8),
        (8, 2, 2, 4),
        (8, 2, 5, 4),  # as many subtasks as slots, or more: the slots' share
        (8, 4, 1, 8),
        (8, 4, 2, 4),
        (2, 2, 1, 2),  # fewer: the cores the free slots would use too
        (2, 4, 3, 1),
    ],
)
def test_each_task_gets_its_share_of_the_cores_and_at_least_one(
    cores: int, slots: int, parallelism: int | None, partitions: int
) -> None:
    assert task_partitions(cores, slots, parallelism) == partitions


class _Server:
    def __init__(self, master: str) -> None:
        self.master = master


@pytest.mark.parametrize(
    ("given", "remote", "cores", "shared", "own_master", "parallelism", "want"),
    [
        (None, None, None, None, "local[4]", 2, 2),  # its own server: the share of its cores (4 cores, 2 slots)
        (None, None, None, None, "local[4]", 1, 4),  # a vertex of one subtask: every core
        (
            None,
            "sc://elsewhere:15002",
            None,
            None,
            None,
            2,
            None,
        ),  # a server it was given, cores unknown: Spark decides
        (None, "sc://elsewhere:15002", 8, None, None, 4, 4),  # ... told its cores: 8 cores, its 2 slots
        (None, "sc://elsewhere:15002", 8, 8, None, 8, 1),  # ... and that 8 slots share them (the embedded cluster)
        (None, "sc://elsewhere:15002", 8, 8, None, 2, 4),  # ... a vertex of 2 subtasks among them
        (3, "sc://elsewhere:15002", 8, 8, None, 1, 3),  # told a number: that, whatever the vertex
        (0, None, None, None, "local[4]", 2, None),  # 0: Spark decides, even on its own server
        (None, None, None, None, "spark://master:7077", 2, None),  # its own server on a cluster master: cores unknown
    ],
)
def test_a_taskmanager_gives_its_tasks_their_share(
    log,
    tmp_path,
    given,
    remote,
    cores,
    shared,
    own_master,  # type: ignore[no-untyped-def]
    parallelism,
    want,
) -> None:
    from tests.services.failover_helpers import ManualWorld, TinySlots, tm

    t = tm(
        log,
        ManualWorld(),
        tmp_path,
        TinySlots(),
        n=2,
        task_partitions=given,
        spark_remote=remote,
        spark_cores=cores,
        spark_slots=shared,
    )
    if own_master is not None:
        t.spark.server = _Server(own_master)  # type: ignore[assignment]  # as url() leaves it
    assert t.spark.partitions(parallelism) == want


@pytest.mark.timeout(60)
def test_the_share_travels_with_each_task_to_its_worker(log, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The TaskManager hands each Spark task its share in the runtime the worker reads: here
    8 cores that 8 slots share, for a vertex of 2 subtasks, 4 each."""
    from tests.services.failover_helpers import (
        ManualWorld,
        TinySlots,
        jm,
        lead,
        pump,
        register_tm,
        source_graph,
        submit,
        tm,
    )

    world, slots = ManualWorld(), TinySlots()
    a = jm(log, world, "jm-a", tmp_path)
    lead(a, world)
    t = tm(log, world, tmp_path, slots, n=2, spark_remote="sc://elsewhere:15002", spark_cores=8, spark_slots=8)
    register_tm(a, t, world)
    submit(log, world, "j1", source_graph("j1", parallelism=2, splits=2))
    pump(
        [lambda: a.step(block_ms=None), lambda: t.step(block_ms=None)],
        lambda: len(slots.launched) == 2,
        what="the launches",
        world=world,
        advance_ms=10,
    )
    assert [(r["partitions"], r["spark_remote"]) for r in slots.runtimes] == [(4, "sc://elsewhere:15002")] * 2


@pytest.mark.parametrize(
    ("given", "master", "slots", "want"),
    [
        (None, "local[8]", 4, ["--spark-cores", "8", "--spark-slots", "4"]),  # every slot of the cluster shares them
        (None, "local[8]", 6, ["--spark-cores", "8", "--spark-slots", "6"]),  # scaled up: counted after scaling
        (None, "local[8]", 0, ["--spark-cores", "8", "--spark-slots", "1"]),
        ("3", "local[8]", 4, ["--task-partitions", "3"]),  # $SLUICE_TASK_PARTITIONS at start, also for later ones
        ("0", "local[8]", 4, ["--task-partitions", "0"]),
        (None, None, 4, []),  # a server the cluster did not start: Spark decides
        (None, "spark://master:7077", 4, []),  # servers on a cluster master: cores unknown
    ],
)
def test_the_embedded_cluster_tells_its_taskmanagers_the_cores_all_its_slots_share(
    tmp_path, monkeypatch, given, master, slots, want
) -> None:  # type: ignore[no-untyped-def]
    from sluice.cli.embedded import _record_share, task_partition_args
    from sluice.config import load
    from sluice.services.embedded import EmbeddedCluster

    cluster = EmbeddedCluster(tmp_path / "home")
    environ = {} if given is None else {"SLUICE_TASK_PARTITIONS": given}
    _record_share(cluster, master, load(environ=environ).task_partitions)  # the setting at start
    monkeypatch.delenv("SLUICE_TASK_PARTITIONS", raising=False)  # `sluice scale` from another shell
    assert task_partition_args(cluster, slots) == want


def test_a_cluster_recorded_before_shares_existed_gives_none(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from sluice.cli.embedded import task_partition_args
    from sluice.services.embedded import EmbeddedCluster

    assert task_partition_args(EmbeddedCluster(tmp_path / "home"), 4) == []


def test_the_cores_of_local_star_are_those_this_process_may_use_and_a_cgroup_quota_bounds_them(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from sluice.services.taskmanager.share import usable_cores

    mine = len(os.sched_getaffinity(0))
    assert usable_cores(tmp_path / "absent") == mine
    (tmp_path / "max").write_text("max 100000\n")
    assert usable_cores(tmp_path / "max") == mine
    (tmp_path / "half").write_text("50000 100000\n")  # half a core: at least one
    assert usable_cores(tmp_path / "half") == 1
    (tmp_path / "many").write_text(f"{(mine + 5) * 100000} 100000\n")  # a quota above the affinity
    assert usable_cores(tmp_path / "many") == mine
