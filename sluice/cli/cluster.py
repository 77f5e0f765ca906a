"""The embedded cluster: ``sluice cluster up|start|stop``, ``sluice scale``, ``sluice status``."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time

import click
import orjson
from rich.console import Console
from rich.table import Table

from sluice.errors import RedisUnavailable, ServiceError
from sluice.services.embedded import EmbeddedCluster
from sluice.services.embedded.supervisor import ProcessInfo, Stopped, alive, descendants
from sluice.services.projector import Projector
from sluice.services.taskmanager.share import local_cores
from sluice.store import EventLog, ReadModels
from sluice.store.connection import ping, redact

from .context import Context

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
        table.add_row(r["resource_id"], r["host"], str(r["slots"]), f"[{style}]{r['status']}[/]", since, r.get("reason") or "")
    console.print(table)
    for r in active:  # (reported by the TaskManager: it cannot see the leader's storage root)
        if r.get("storage_problem"):
            console.print(f"[yellow]warning:[/] TaskManager {r['resource_id']} on host {r['host']} cannot see the "
                          f"storage root {r.get('storage_root')} ({r.get('storage_path')}: {r['storage_problem']}): "
                          "jobs are refused while it is registered (README 'Across hosts')", soft_wrap=True)
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


def _registered(tms: dict, names: set[str]) -> bool:
    return all(tms.get(n, {}).get("status") == "REGISTERED" for n in names)


def _fsync(obj: Context, appendfsync: str | None) -> None:
    if appendfsync is not None:
        obj.cluster.env["SLUICE_REDIS_APPENDFSYNC"] = appendfsync


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
    info = cluster.spawn(role, url, *args, "--metrics-port", str(port), "--metrics-host", _METRICS_HOST,
                         detach=detach)
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
    """``--spark-servers``: one Spark Connect server for the whole embedded cluster, started
    first (its JVM is the slowest thing to start) and shared by every TaskManager; or one per
    TaskManager, started when its first task needs Spark."""
    return click.option(
        "--spark-servers", type=click.Choice(SPARK_SERVERS), default="shared", show_default=True,
        envvar="SLUICE_SPARK_SERVERS",
        help="One Spark Connect server shared by all TaskManagers, started with the cluster, or one per "
             "TaskManager, started on its first Spark task (a JVM each: on one host they compete for its "
             "cores and memory; `sluice bench coldstart` measures both). $SLUICE_SPARK_SERVERS.")(f)


def _start(obj: Context, taskmanagers: int, slots: int, detach: bool,
           spark_servers: str = "shared") -> tuple[EmbeddedCluster, EventLog, list]:
    cluster = obj.cluster
    if cluster.processes("jobmanager"):
        raise ServiceError(f"an embedded cluster already runs in {cluster.home}; `sluice cluster stop` it first")
    external = bool(os.environ.get("SLUICE_SPARK_REMOTE") or cluster.env.get("SLUICE_SPARK_REMOTE"))
    # The master of the servers the cluster starts (a shared one, or each TaskManager's);
    # None: it uses one it did not start, whose cores it cannot see (Spark decides).
    master = None if external else os.environ.get("SLUICE_SPARK_MASTER") or "local[*]"
    if spark_servers == "shared" and master is not None:
        cluster.start_spark(master=master, detach=detach)  # first: it overlaps the rest of the start
    _record_share(cluster, master)
    url = cluster.redis_url(detach=detach)
    log = obj.log()
    spawn(cluster, "projector", url, detach=detach)
    spawn(cluster, "jobmanager", url, detach=detach)
    share = _task_partition_args(cluster, taskmanagers * slots)
    tms = [spawn(cluster, "taskmanager", url, "--slots", str(slots), *share, detach=detach)
           for _ in range(taskmanagers)]
    names = {t.name for t in tms}
    wait_for(log, lambda leader, rows: bool(leader) and _registered(rows, names),
             f"waiting for {taskmanagers} TaskManagers to register")
    return cluster, log, tms


def _record_share(cluster: EmbeddedCluster, master: str | None) -> None:
    """Keep in cluster.json what decides the Spark partitions of a task (``taskmanager.share``)
    on this cluster, for the TaskManagers ``sluice scale`` adds later: $SLUICE_TASK_PARTITIONS
    as the start was given it, else the master of the servers the cluster starts (None: it
    starts none)."""
    data = cluster._read()
    data["task_share"] = {"given": os.environ.get("SLUICE_TASK_PARTITIONS") or None, "master": master}
    cluster._write(data)


def _task_partition_args(cluster: EmbeddedCluster, slots: int) -> list[str]:
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


def _stop(cluster: EmbeddedCluster, log: EventLog | None) -> None:
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
            wait_for(log, lambda leader, rows: all(rows.get(n, {}).get("status") != "REGISTERED" for n in names),
                     "waiting for TaskManagers to unregister", timeout=15)
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
        console.print(f"killed {len(left)} processes the cluster's processes left behind (pids {', '.join(map(str, left))})")
    cluster.stop_redis()


def _stop_without_redis(cluster: EmbeddedCluster) -> None:
    rec = cluster.redis_record()
    where = f"at {redact(rec['url'])} " if rec else ""
    console.print(f"[yellow]the cluster's Redis {where}does not answer: stopping its processes without waiting for "
                  f"TaskManagers to unregister (SIGTERM, then SIGKILL after {_GRACE_S:.0f} s)[/]", soft_wrap=True)
    say(cluster.stop_everything(grace=_GRACE_S))


_GRACE_S = 10.0


def say(stopped: Stopped) -> None:
    for what, pid in stopped.terminated:
        console.print(f"stopped {what} (pid {pid})")
    for what, pid in stopped.killed:
        console.print(f"[yellow]killed {what} (pid {pid}): still running {_GRACE_S:.0f} s after SIGTERM[/]")
    if not stopped.terminated and not stopped.killed:
        console.print("no process of the cluster was running")


def _redis_answers(obj: Context) -> bool:
    """Whether the cluster's Redis (given, or the embedded one recorded) answers, without
    starting one."""
    if obj.settings.redis_url:
        return True  # a Redis the cluster does not own: commands say themselves if it is away
    rec = obj.cluster.redis_record()
    return rec is not None and ping(rec["url"], timeout=1.0)


@click.group()
def cluster() -> None:
    """The embedded cluster (Redis, a JobManager, TaskManagers, the projector) in --home."""


@cluster.command()
@click.option("--taskmanagers", "-n", default=2, show_default=True, type=click.IntRange(0, 64))
@click.option("--slots", "-s", default=2, show_default=True, type=click.IntRange(1, 1024))
@click.option("--hold", is_flag=True, help="Keep the cluster up until Ctrl-C.")
@click.option("--appendfsync", type=click.Choice(["everysec", "always"]), default=None,
              help="The embedded Redis's AOF fsync: everysec (default; a Redis crash may lose its last second, "
                   "paid for by re-running unfinished tasks) or always (loses nothing). $SLUICE_REDIS_APPENDFSYNC.")
@spark_servers_option
@click.pass_obj
def up(obj: Context, taskmanagers: int, slots: int, hold: bool, appendfsync: str | None, spark_servers: str) -> None:
    """Start the embedded cluster, show it once every TaskManager registered, then stop it."""
    started = time.monotonic()
    _fsync(obj, appendfsync)
    cluster, log, _ = _start(obj, taskmanagers, slots, detach=False, spark_servers=spark_servers)
    show(*cluster_table(log))
    console.print(f"cluster up in {time.monotonic() - started:.1f} s; data in {cluster.home}/")
    try:
        if hold:
            console.print("holding; Ctrl-C stops the cluster")
            while True:
                time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        _stop(cluster, log)
    show(*cluster_table_offline(obj), title="after stop")
    console.print("stopped cleanly")


def cluster_table_offline(obj: Context) -> tuple[dict, dict]:
    """Read the tables of a stopped embedded cluster (Redis comes back on its data)."""
    fresh = Context(obj.settings)
    return cluster_table(fresh.log())


@cluster.command()
@click.option("--taskmanagers", "-n", default=2, show_default=True, type=click.IntRange(0, 64))
@click.option("--slots", "-s", default=2, show_default=True, type=click.IntRange(1, 1024))
@click.option("--appendfsync", type=click.Choice(["everysec", "always"]), default=None,
              help="The embedded Redis's AOF fsync: everysec (default; a Redis crash may lose its last second, "
                   "paid for by re-running unfinished tasks) or always (loses nothing). $SLUICE_REDIS_APPENDFSYNC.")
@spark_servers_option
@click.pass_obj
def start(obj: Context, taskmanagers: int, slots: int, appendfsync: str | None, spark_servers: str) -> None:
    """Start the embedded cluster in the background (stop it with `sluice cluster stop`)."""
    _fsync(obj, appendfsync)
    cluster, log, _ = _start(obj, taskmanagers, slots, detach=True, spark_servers=spark_servers)
    show(*cluster_table(log))
    endpoints = metrics_endpoints(cluster)
    show_endpoints([{"role": p.role, "name": p.name, "metrics": endpoints.get(p.name)} for p in cluster.processes()])
    console.print(f"running in the background; Redis at {cluster.redis_url(start=False)}")


@cluster.command("prepare-spark")
@click.option("--force", is_flag=True, help="Build it again even if there is one.")
def prepare_spark(force: bool) -> None:
    """Build the Spark server's class-data archive for this Java and PySpark (once; `scripts/setup`
    does it): Spark servers started afterwards listen and answer their first query seconds
    sooner. $SLUICE_SPARK_CDS names another file, or `off`."""
    from sluice.services.embedded.spark_connect import (
        build_class_archive,
        check_java,
        class_archive,
        prune_class_archives,
    )

    archive = class_archive()
    if archive is None:
        console.print("no class-data archive: $SLUICE_SPARK_CDS is off (or no Java is installed)")
        return
    for old in prune_class_archives(archive.parent):
        console.print(f"removed {old}: built for a PySpark install that is gone", soft_wrap=True)
    if archive.is_file() and not force:
        console.print(f"Spark's class-data archive is ready: {archive}", soft_wrap=True)
        return
    check_java()
    with console.status("building Spark's class-data archive (a Spark server runs a sample job, then writes the "
                        "classes it loaded as it exits)"):
        took = build_class_archive(archive)
    console.print(f"built {archive} ({archive.stat().st_size / 1e6:,.0f} MB) in {took:.0f} s", soft_wrap=True)


@cluster.command()
@click.pass_obj
def stop(obj: Context) -> None:
    """Stop the background embedded cluster (TaskManagers unregister first). If its Redis is
    dead, every process it started still goes (SIGTERM, then SIGKILL)."""
    cluster = obj.cluster
    _stop(cluster, obj.log() if _redis_answers(obj) else None)
    console.print("stopped")


@click.command()
@click.option("--taskmanagers", "-n", required=True, type=click.IntRange(0, 64), help="How many TaskManagers to run.")
@click.option("--slots", "-s", default=2, show_default=True, type=click.IntRange(1, 1024), help="Slots of new ones.")
@click.pass_obj
def scale(obj: Context, taskmanagers: int, slots: int) -> None:
    """Add or remove TaskManagers of the running embedded cluster."""
    cluster = obj.cluster
    if not cluster.processes("jobmanager"):
        raise ServiceError(f"no embedded cluster runs in {cluster.home}; start one with `sluice cluster start`")
    url = cluster.redis_url(start=False)
    log = obj.log()
    running = cluster.processes("taskmanager")
    if taskmanagers > len(running):
        _, rows = cluster_table(log)
        # The share of the cores once the new ones run (those running keep theirs).
        total = sum(int(rows.get(p.name, {}).get("slots", slots)) for p in running)
        total += slots * (taskmanagers - len(running))
        share = _task_partition_args(cluster, total)
        new = [spawn(cluster, "taskmanager", url, "--slots", str(slots), *share)
               for _ in range(taskmanagers - len(running))]
        names = {t.name for t in new}
        leader, tms = wait_for(log, lambda leader, rows: _registered(rows, names), f"waiting for {len(new)} new TaskManagers")
    elif taskmanagers < len(running):
        going = running[taskmanagers:]
        names = {t.name for t in going}
        cluster.terminate(going)
        leader, tms = wait_for(log, lambda leader, rows: all(rows.get(n, {}).get("status") != "REGISTERED" for n in names),
                               f"waiting for {len(going)} TaskManagers to leave")
    else:
        leader, tms = cluster_table(log)
    show(leader, tms)


@click.command()
@click.argument("job_id", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the tables as JSON.")
@click.pass_obj
def status(obj: Context, job_id: str | None, as_json: bool) -> None:
    """The cluster (leader, epoch, TaskManagers), or one job's ExecutionGraph with JOB_ID.
    Works on a stopped embedded cluster too. Exits 1 when Redis is away, saying which of
    the embedded cluster's processes still run."""
    running = [] if obj.settings.redis_url else obj.cluster.processes()
    if running and not _redis_answers(obj):
        rec = obj.cluster.redis_record() or {}
        pid = rec.get("pid")
        why = ("its process is gone" if pid and not alive(int(pid)) else "its process runs but does not answer") \
            if pid else "none is recorded"
        click.secho(f"error: the embedded cluster's Redis {redact(rec.get('url', ''))} is away ({why}); "
                    "still running:", fg="red", err=True)
        for p in running:
            click.echo(f"  {p.role} {p.name} (pid {p.pid})", err=True)
        click.echo("`sluice cluster stop` stops them; `sluice cluster start` starts the cluster again on its data",
                   err=True)
        sys.exit(1)
    if job_id:
        from .jobs import show_job, table_json

        job = table_json(obj.log(), job_id)
        if as_json:
            click.echo(orjson.dumps(job, option=orjson.OPT_INDENT_2).decode())
        else:
            show_job(job)
        return
    leader, tms = cluster_table(obj.log())
    endpoints = metrics_endpoints(obj.cluster) if running else {}
    procs = [{"role": p.role, "name": p.name, "pid": p.pid, "metrics": endpoints.get(p.name)} for p in running]
    if as_json:
        body: dict = {"leader": leader or None, "taskmanagers": sorted(tms.values(), key=lambda r: r["resource_id"])}
        if procs:
            body["processes"] = procs
        click.echo(orjson.dumps(body, option=orjson.OPT_INDENT_2).decode())
    else:
        show(leader, tms)
        if procs:
            console.print("embedded cluster processes running: " + ", ".join(
                f"{p['role']} {p['name']} (pid {p['pid']})" for p in procs), soft_wrap=True)
        if endpoints:
            show_endpoints(procs)


def show_endpoints(procs: list[dict]) -> None:
    """Where each process serves its Prometheus metrics."""
    console.print("metrics (Prometheus):")
    for p in procs:
        if p.get("metrics"):
            console.print(f"  {p['role']} {p['name']}: {p['metrics']}", soft_wrap=True, highlight=False)


def register(cli: click.Group) -> None:
    cli.add_command(cluster)
    cli.add_command(scale)
    cli.add_command(status)
