"""The embedded cluster's processes started and stopped, for ``sluice cluster`` and ``sluice
run`` alike: the projector, the JobManager and TaskManagers (each with its metrics endpoint,
recorded in cluster.json), a shared Spark Connect server, waiting until they register or
unregister, and the TaskManager table the commands print."""

from __future__ import annotations

import os
import signal
import socket
import time

from rich.console import Console
from rich.table import Table

from sluice.errors import RedisUnavailable, ServiceError
from sluice.services.embedded import EmbeddedCluster
from sluice.services.embedded.supervisor import ProcessInfo, Stopped, alive, descendants
from sluice.services.projector import Projector
from sluice.services.taskmanager.share import local_cores
from sluice.store import EventLog, ReadModels
from sluice.store.connection import redact

from .context import Context
from .options import setting_option

__all__ = [
    "GRACE_S",
    "SPARK_SERVERS",
    "cluster_table",
    "console",
    "free_port",
    "metrics_endpoints",
    "registered",
    "say",
    "set_appendfsync",
    "show",
    "spark_servers_option",
    "task_partition_args",
    "spawn",
    "start_cluster",
    "stop_cluster",
    "wait_for",
]

console = Console(emoji=False)


def cluster_table(log: EventLog) -> tuple[dict, dict]:
    """(leader row, TaskManager rows) from the read models, brought up to date first."""
    Projector(log).catch_up()
    tables = ReadModels(log)
    _, leader = tables.read(log.keys.cluster, "leadership")
    _, tms = tables.read(log.keys.cluster, "taskmanagers")
    return leader.get("leader", {}), tms


def show(leader: dict, tms: dict, *, title: str = "Sluice cluster") -> None:
    """Print the TaskManager table and a one-line summary under it."""
    active = [r for r in tms.values() if r["status"] == "REGISTERED"]
    table = Table(title=title)
    for col in ("TaskManager", "host", "slots", "status", "since", "reason"):
        table.add_column(col, overflow="fold")
    for r in sorted(tms.values(), key=lambda r: (r["status"] != "REGISTERED", r["resource_id"])):
        style = {"REGISTERED": "green", "LOST": "red", "UNREGISTERED": "dim"}[r["status"]]
        since = time.strftime("%H:%M:%S", time.localtime(r["since"] / 1000))
        table.add_row(
            r["resource_id"], r["host"], str(r["slots"]), f"[{style}]{r['status']}[/]", since, r.get("reason") or ""
        )
    console.print(table)
    for r in active:  # (reported by the TaskManager: it cannot see the leader's storage root)
        if r.get("storage_problem"):
            console.print(
                f"[yellow]warning:[/] TaskManager {r['resource_id']} on host {r['host']} cannot see the "
                f"storage root {r.get('storage_root')} ({r.get('storage_path')}: {r['storage_problem']}): "
                "jobs are refused while it is registered (README 'Across hosts')",
                soft_wrap=True,
            )
    console.print(
        f"leader {leader.get('leader_id', '-')} at epoch {leader.get('epoch', '-')}; "
        f"{len(active)} TaskManagers registered, {sum(r['slots'] for r in active)} slots",
        soft_wrap=True,
    )


def wait_for(log: EventLog, predicate, what: str, timeout: float = 30.0) -> tuple[dict, dict]:
    deadline = time.monotonic() + timeout
    with console.status(what):
        while True:
            leader, tms = cluster_table(log)
            if predicate(leader, tms):
                return leader, tms
            if time.monotonic() > deadline:
                raise ServiceError(f"timed out after {timeout:.0f} s: {what}; see the logs in .sluice/logs")
            time.sleep(0.1)


def registered(tms: dict, names: set[str]) -> bool:
    return all(tms.get(n, {}).get("status") == "REGISTERED" for n in names)


def set_appendfsync(obj: Context) -> None:
    """The embedded Redis's fsync policy: the setting redis_appendfsync in effect."""
    obj.cluster.env["SLUICE_REDIS_APPENDFSYNC"] = obj.settings.redis_appendfsync


_METRICS_HOST = "127.0.0.1"


def free_port(host: str = _METRICS_HOST) -> int:
    """A TCP port nothing listens on now (the OS's pick), for a process about to start."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def spawn(cluster: EmbeddedCluster, role: str, url: str, *args: str, detach: bool = True) -> ProcessInfo:
    """Start one of the embedded cluster's processes with its metrics endpoint on a free port
    of this host, recorded in cluster.json (``metrics``: process name -> URL)."""
    port = free_port()
    info = cluster.spawn(role, url, *args, "--metrics-port", str(port), "--metrics-host", _METRICS_HOST, detach=detach)
    data = cluster._read()  # the supervisor's own reader and writer of cluster.json
    live = {p["name"] for p in data.get("processes", [])}
    endpoints = {n: u for n, u in data.get("metrics", {}).items() if n in live}
    endpoints[info.name] = f"http://{_METRICS_HOST}:{port}/metrics"
    data["metrics"] = endpoints
    cluster._write(data)
    return info


def metrics_endpoints(cluster: EmbeddedCluster) -> dict[str, str]:
    """The metrics URL of each process of the embedded cluster that runs, by name."""
    recorded = cluster._read().get("metrics", {})
    return {p.name: recorded[p.name] for p in cluster.processes() if p.name in recorded}


SPARK_SERVERS = ("shared", "per-taskmanager")


def spark_servers_option(f):
    """``--spark-servers`` (the setting spark_servers): one Spark Connect server for the whole
    embedded cluster, started first (its JVM is the slowest thing to start) and shared by every
    TaskManager; or one per TaskManager, started when its first task needs Spark."""
    return setting_option("spark_servers")(f)


def start_cluster(obj: Context, taskmanagers: int, slots: int, detach: bool) -> tuple[EmbeddedCluster, EventLog, list]:
    """Start the embedded cluster (``--spark-servers`` and the rest: the settings in effect)."""
    cluster = obj.cluster
    s = obj.settings
    if cluster.processes("jobmanager"):
        raise ServiceError(f"an embedded cluster already runs in {cluster.home}; `sluice cluster stop` it first")
    external = bool(s.spark_remote or cluster.env.get("SLUICE_SPARK_REMOTE"))
    # The master of the servers the cluster starts (a shared one, or each TaskManager's);
    # None: it uses one it did not start, whose cores it cannot see (Spark decides).
    master = None if external else s.spark_master
    if s.spark_servers == "shared" and master is not None:
        cluster.start_spark(master=master, detach=detach)  # first: it overlaps the rest of the start
    _record_share(cluster, master, s.task_partitions)
    url = cluster.redis_url(detach=detach)
    log = obj.log()
    spawn(cluster, "projector", url, detach=detach)
    spawn(cluster, "jobmanager", url, detach=detach)
    share = task_partition_args(cluster, taskmanagers * slots)
    tms = [
        spawn(cluster, "taskmanager", url, "--slots", str(slots), *share, detach=detach) for _ in range(taskmanagers)
    ]
    names = {t.name for t in tms}
    wait_for(
        log,
        lambda leader, rows: bool(leader) and registered(rows, names),
        f"waiting for {taskmanagers} TaskManagers to register",
    )
    return cluster, log, tms


def _record_share(cluster: EmbeddedCluster, master: str | None, given: int | None) -> None:
    """Keep in cluster.json what decides the Spark partitions of a task (``taskmanager.share``)
    on this cluster, for the TaskManagers ``sluice scale`` adds later: $SLUICE_TASK_PARTITIONS
    as the start was given it, else the master of the servers the cluster starts (None: it
    starts none)."""
    data = cluster._read()
    data["task_share"] = {"given": str(given) if given is not None else None, "master": master}
    cluster._write(data)


def task_partition_args(cluster: EmbeddedCluster, slots: int) -> list[str]:
    """What a new TaskManager of a cluster of ``slots`` slots in all is told of its tasks'
    share (``taskmanager.share``): the ``--task-partitions`` the start was given, else the
    cores of the cluster's Spark servers and that all ``slots`` share them (one host,
    whichever server runs their tasks); nothing when the cluster uses a server it did not
    start, or a non-local master (Spark decides)."""
    share = cluster._read().get("task_share") or {}
    if share.get("given"):
        return ["--task-partitions", str(share["given"])]
    cores = local_cores(share["master"]) if share.get("master") else None
    return [] if cores is None else ["--spark-cores", str(cores), "--spark-slots", str(max(1, slots))]


def stop_cluster(cluster: EmbeddedCluster, log: EventLog | None) -> None:
    """Stop everything the embedded cluster started (see ``_stop_processes``); cluster.json
    then names no metrics endpoints."""
    try:
        _stop_processes(cluster, log)
    finally:
        cluster.stop_spark()  # the shared server, if the cluster started one
        data = cluster._read()
        if data.pop("metrics", None) is not None:
            cluster._write(data)


def _stop_processes(cluster: EmbeddedCluster, log: EventLog | None) -> None:
    """Stop everything the embedded cluster started. With Redis answering, TaskManagers
    get SIGTERM and are given time to unregister; without (``log`` None, or Redis gone
    meanwhile) nothing waits on Redis: every recorded process and its children get SIGTERM,
    then SIGKILL after a grace period."""
    if log is None:
        _stop_without_redis(cluster)
        return
    children = descendants([p.pid for p in cluster.processes()])  # RQ workers, Spark servers of TaskManagers
    try:
        tms = cluster.processes("taskmanager")
        names = {t.name for t in tms}
        cluster.terminate(tms)
        # Only now: a worker's Spark client says goodbye to its server as it exits, and would
        # wait for one that is going away until its TaskManager kills it.
        cluster.spark_going()
        try:
            wait_for(
                log,
                lambda leader, rows: all(rows.get(n, {}).get("status") != "REGISTERED" for n in names),
                "waiting for TaskManagers to unregister",
                timeout=15,
            )
        except ServiceError as exc:
            console.print(f"[yellow]{exc}[/]")
    except RedisUnavailable as exc:
        console.print(f"[yellow]Redis went away while stopping ({exc})[/]")
        _stop_without_redis(cluster)
        return
    cluster.terminate(cluster.processes())
    left = [pid for pid in children if alive(pid)]
    for pid in left:  # their parent is gone: nothing else will stop them
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if left:
        console.print(
            f"killed {len(left)} processes the cluster's processes left behind (pids {', '.join(map(str, left))})"
        )
    cluster.stop_redis()


def _stop_without_redis(cluster: EmbeddedCluster) -> None:
    rec = cluster.redis_record()
    where = f"at {redact(rec['url'])} " if rec else ""
    console.print(
        f"[yellow]the cluster's Redis {where}does not answer: stopping its processes without waiting for "
        f"TaskManagers to unregister (SIGTERM, then SIGKILL after {GRACE_S:.0f} s)[/]",
        soft_wrap=True,
    )
    say(cluster.stop_everything(grace=GRACE_S))


GRACE_S = 10.0


def say(stopped: Stopped) -> None:
    for what, pid in stopped.terminated:
        console.print(f"stopped {what} (pid {pid})")
    for what, pid in stopped.killed:
        console.print(f"[yellow]killed {what} (pid {pid}): still running {GRACE_S:.0f} s after SIGTERM[/]")
    if not stopped.terminated and not stopped.killed:
        console.print("no process of the cluster was running")
