"""A task's share of its Spark server (services/taskmanager/share.py): the cores its slot
stands for, parsed from the server's master; and what a TaskManager gives its tasks."""

from __future__ import annotations

import os

import pytest

from sluice.services.taskmanager.share import local_cores, task_partitions


@pytest.mark.parametrize(("master", "cores"), [
    ("local", 1), ("local[1]", 1), ("local[4]", 4), ("local[4,3]", 4), (" local[2] ", 2), ("local[0]", 1),
    ("local[*]", os.cpu_count() or 1), ("local[*, 2]", os.cpu_count() or 1),
])
def test_a_local_master_names_its_cores(master: str, cores: int) -> None:
    assert local_cores(master) == cores


@pytest.mark.parametrize("master", ["spark://host:7077", "yarn", "k8s://https://api:6443", "sc://host:15002",
                                    "local-cluster[2,1,1024]", "localhost", ""])
def test_a_master_whose_cores_this_process_cannot_see_has_none(master: str) -> None:
    assert local_cores(master) is None
    assert task_partitions(master, 2) is None


@pytest.mark.parametrize(("master", "slots", "partitions"), [
    ("local[8]", 2, 4), ("local[8]", 3, 2), ("local[2]", 2, 1), ("local[2]", 4, 1), ("local[1]", 1, 1),
    ("local[16]", 1, 16), ("local[8]", 0, 8),
])
def test_each_slot_gets_its_share_of_the_cores_and_at_least_one(master: str, slots: int, partitions: int) -> None:
    assert task_partitions(master, slots) == partitions


class _Server:
    def __init__(self, master: str) -> None:
        self.master = master


@pytest.mark.parametrize(("given", "remote", "own_master", "want"), [
    (None, None, "local[4]", 2),  # its own server: the share of its cores (4 cores, 2 slots)
    (None, "sc://elsewhere:15002", None, None),  # a server it was given: Spark decides
    (3, "sc://elsewhere:15002", None, 3),  # what it was told (the embedded cluster tells its TaskManagers)
    (0, None, "local[4]", None),  # 0: Spark decides, even on its own server
    (None, None, "spark://master:7077", None),  # its own server on a cluster master: cores unknown
])
def test_a_taskmanager_gives_its_tasks_their_share(log, tmp_path, given, remote, own_master, want) -> None:  # type: ignore[no-untyped-def]
    from tests.services.failover_helpers import ManualWorld, TinySlots, tm

    t = tm(log, ManualWorld(), tmp_path, TinySlots(), n=2, task_partitions=given, spark_remote=remote)
    if own_master is not None:
        t._spark_server = _Server(own_master)  # type: ignore[assignment]  # as _spark() leaves it
    assert t._partitions() == want


@pytest.mark.timeout(60)
def test_the_share_travels_with_each_task_to_its_worker(log, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The TaskManager hands each Spark task its share in the runtime the worker reads."""
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
    t = tm(log, world, tmp_path, slots, n=2, task_partitions=3, spark_remote="sc://elsewhere:15002")
    register_tm(a, t, world)
    submit(log, world, "j1", source_graph("j1", parallelism=2, splits=2))
    pump([lambda: a.step(block_ms=None), lambda: t.step(block_ms=None)], lambda: len(slots.launched) == 2,
         what="the launches", world=world, advance_ms=10)
    assert [(r["partitions"], r["spark_remote"]) for r in slots.runtimes] == [(3, "sc://elsewhere:15002")] * 2


@pytest.mark.parametrize(("given", "master", "slots", "want"), [
    (None, "local[8]", 4, ["--task-partitions", "2"]),  # the shared server: every slot of the cluster shares it
    (None, "local[8]", 6, ["--task-partitions", "1"]),  # scaled up: the new ones get the smaller share
    (None, "local[8]", 0, ["--task-partitions", "8"]),
    ("3", "local[8]", 4, ["--task-partitions", "3"]),  # $SLUICE_TASK_PARTITIONS at start, also for later ones
    ("0", "local[8]", 4, ["--task-partitions", "0"]),
    (None, None, 4, []),  # a server the cluster did not start: Spark decides
    (None, "spark://master:7077", 4, []),  # per-TaskManager servers on a cluster master: cores unknown
])
def test_the_embedded_cluster_gives_its_taskmanagers_the_share_of_all_its_slots(
        tmp_path, monkeypatch, given, master, slots, want) -> None:  # type: ignore[no-untyped-def]
    from sluice.cli.cluster import _record_share, _task_partition_args
    from sluice.services.embedded import EmbeddedCluster

    cluster = EmbeddedCluster(tmp_path / "home")
    if given is None:
        monkeypatch.delenv("SLUICE_TASK_PARTITIONS", raising=False)
    else:
        monkeypatch.setenv("SLUICE_TASK_PARTITIONS", given)
    _record_share(cluster, master)
    monkeypatch.delenv("SLUICE_TASK_PARTITIONS", raising=False)  # `sluice scale` from another shell
    assert _task_partition_args(cluster, slots) == want


def test_a_cluster_recorded_before_shares_existed_gives_none(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from sluice.cli.cluster import _task_partition_args
    from sluice.services.embedded import EmbeddedCluster

    assert _task_partition_args(EmbeddedCluster(tmp_path / "home"), 4) == []


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
