"""Where a job ran, host by host, as the log tells it (the job's fold: each subtask's last
attempt and its TaskManager; the membership view: each TaskManager's host), and which
partitions of its keyed exchanges were read across hosts, as the consumer's host sees them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sluice.client import Client
from sluice.services.dataplane.keygroups import key_group_range
from sluice.services.jobs.core import partition_path
from sluice.store import EventLog
from sluice.views.taskmanagers import taskmanagers

__all__ = ["hosts_by_vertex", "hosts_ran_on", "CrossRead", "cross_reads"]


def hosts_by_vertex(log: EventLog, job_id: str) -> dict[str, list[str | None]]:
    """Vertex -> the host of each subtask's last attempt (None: never placed)."""
    host_of = {r["resource_id"]: r["host"] for r in taskmanagers(log)}
    job = Client(log).job(job_id)
    return {
        name: [host_of.get(e.taskmanager) if e.taskmanager else None for e in v.subtasks]
        for name, v in job.vertices.items()
    }


def hosts_ran_on(log: EventLog, job_id: str) -> set[str]:
    """The hosts of every TaskManager any attempt of the job ran on (RUNNING in its facts),
    the attempts a fault made run again included: a host declared lost during the job ran
    its first attempts, and the survivors the later ones."""
    from sluice.events import TaskState, UpdateTaskExecutionState

    host_of = {r["resource_id"]: r["host"] for r in taskmanagers(log)}
    ran = {
        env.event.taskmanager
        for _, env in log.replay(log.keys.facts(log.keys.job(job_id)))
        if isinstance(env.event, UpdateTaskExecutionState)
        and env.event.state == TaskState.RUNNING
        and env.event.taskmanager
    }
    return {h for tm in ran if (h := host_of.get(tm))}


@dataclass(frozen=True)
class CrossRead:
    """Consumer subtask ``consumer`` of ``target`` on ``consumer_host`` had key groups
    ``key_groups`` to read in the partition of ``source``'s subtask ``producer`` written on
    ``producer_host`` (another host)."""

    source: str
    target: str
    producer: int
    producer_host: str
    consumer: int
    consumer_host: str
    key_groups: tuple[int, ...]


def cross_reads(log: EventLog, job_id: str, listdir: Callable[[str, str], list[str]]) -> list[CrossRead]:
    """Every keyed-exchange read across hosts in the job's last attempts: ``listdir(host, path)``
    lists a producer's partition directory as ``host`` sees it (its ``_kg=N`` entries)."""
    job = Client(log).job(job_id)
    where = hosts_by_vertex(log, job_id)
    out = []
    for edge in job.graph.edges:
        if edge.exchange != "keyed":
            continue
        producers, consumers = job.vertices[edge.source].subtasks, job.vertices[edge.target].subtasks
        for p in producers:
            p_host = where[edge.source][p.subtask]
            root = partition_path(job.storage_root, job_id, edge.source, p.subtask, p.attempt).removeprefix("file://")
            for c in consumers:
                c_host = where[edge.target][c.subtask]
                if not p_host or not c_host or p_host == c_host:
                    continue
                groups_of_edge = edge.max_parallelism or job.graph.max_parallelism
                first, last = key_group_range(groups_of_edge, len(consumers), c.subtask)
                groups = tuple(
                    sorted(
                        n
                        for name in listdir(c_host, root)
                        if name.startswith("_kg=") and first <= (n := int(name[4:])) <= last
                    )
                )
                if groups:
                    out.append(CrossRead(edge.source, edge.target, p.subtask, p_host, c.subtask, c_host, groups))
    return out
