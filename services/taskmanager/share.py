"""A task's share of its Spark server: as many Spark partitions as the cores its slot stands for.

Flink runs each subtask in one thread: the parallelism of a vertex is its number of
subtasks, and a slot is a share of its TaskManager. Sluice's tasks run on a Spark server
that several slots share (all of a TaskManager's, and in the embedded cluster every
TaskManager's), and by default Spark splits each task's input across all the server's
cores and shuffles it into ``spark.sql.shuffle.partitions``: every task competes for every
core, and a keyed aggregation or join inside one task pays a shuffle of its own, although
the job's keyed exchange already partitioned its data.

With a share of ``n`` partitions, a task reads its input (its splits, or the partitions it
consumes) as at most ``n`` Spark partitions, its shuffles make ``n``, and its keyed output
is written from those ``n`` without another shuffle. With ``n = 1`` a task is one thread,
as a Flink subtask is: Spark then plans an aggregation or a join over the task's input
without any exchange (one partition is clustered by every key). Measured by
``scripts/bench wordcount`` (issue 11).

The share is the server's cores divided by the slots that share it, or by the vertex's
subtasks when it has fewer than slots (a vertex of one subtask gets every core), at least
one. A server whose cores are not known (a remote ``sc://`` not described by
``--spark-cores``, or a cluster master) gives no share: Spark decides, as before.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

__all__ = ["usable_cores", "local_cores", "task_partitions", "configure", "coalesced"]

SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
_LOCAL = re.compile(r"local(?:\[(\*|\d+)(?:\s*,\s*\d+)?\])?")
"""``local``, ``local[N]``, ``local[*]``, and their ``[N, maxFailures]`` forms."""


def usable_cores(cgroup: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """The cores this process may run on, as the JVM counts them for ``local[*]``: the CPUs
    of its affinity, fewer under a cgroup v2 CPU quota (a container's ``--cpus``)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = cgroup.read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass  # no cgroup v2 quota to read
    return max(1, cores)


def local_cores(master: str) -> int | None:
    """The cores a ``local`` Spark master runs tasks on (None: not a local master)."""
    m = _LOCAL.fullmatch(master.strip())
    if m is None:
        return None
    cores = m.group(1)
    if cores is None:
        return 1
    if cores == "*":
        return usable_cores()
    return max(1, int(cores))


def task_partitions(cores: int, slots: int, parallelism: int | None = None) -> int:
    """The share of a task of a vertex of ``parallelism`` subtasks, on a server of ``cores``
    that ``slots`` slots share: the cores divided by the slots, or by the subtasks when the
    vertex has fewer (its subtasks then use the cores the slots they leave free would), at
    least one."""
    users = slots if parallelism is None else min(slots, parallelism)
    return max(1, cores // max(1, users))


def configure(spark: Any, partitions: int | None) -> None:
    """Make ``spark``'s shuffles produce the task's share of partitions (a Spark Connect
    session's SQL settings are its own: the other slots' sessions are not touched). Set at
    every task (one round trip), so that a setting an earlier task's code made is undone."""
    if partitions:
        spark.conf.set(SHUFFLE_PARTITIONS, str(partitions))


def coalesced(df: Any, partitions: int | None) -> Any:
    """``df`` as at most the task's share of partitions (a narrow coalesce: no shuffle)."""
    return df.coalesce(partitions) if partitions else df
