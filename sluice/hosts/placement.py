"""Where a job ran, host by host, as the log tells it: the job's fold (its final attempts and
the TaskManager each ran on) and the membership view (each TaskManager's host)."""

from __future__ import annotations

from sluice.client import Client
from sluice.store import EventLog
from sluice.views.taskmanagers import taskmanagers

__all__ = ["hosts_by_vertex", "crossings"]


def hosts_by_vertex(log: EventLog, job_id: str) -> dict[str, list[str | None]]:
    """Vertex -> the host of each subtask's last attempt (None: never placed)."""
    host_of = {r["resource_id"]: r["host"] for r in taskmanagers(log)}
    job = Client(log).job(job_id)
    return {name: [host_of.get(e.taskmanager) if e.taskmanager else None for e in v.subtasks]
            for name, v in job.vertices.items()}


def crossings(log: EventLog, job_id: str) -> dict[tuple[str, str], set[tuple[str, str]]]:
    """Each keyed exchange (producer vertex, consumer vertex) -> the (consumer's host, producer's
    host) pairs on different hosts: a consumer subtask reads its key groups from every
    producer subtask, so each pair is a partition read across hosts."""
    job = Client(log).job(job_id)
    where = hosts_by_vertex(log, job_id)
    out: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for edge in job.graph.edges:
        if edge.exchange != "keyed":
            continue
        pairs = {(c, p) for c in where[edge.target] for p in where[edge.source] if c and p and c != p}
        out[(edge.source, edge.target)] = pairs
    return out
