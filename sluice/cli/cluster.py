"""The embedded cluster: ``sluice cluster up|start|stop``, ``sluice scale``, ``sluice status``."""

from __future__ import annotations

import sys
import time

import click
import orjson

from sluice.errors import ServiceError
from sluice.services.embedded.supervisor import alive
from sluice.store.connection import ping, redact

from .context import Context
from .embedded import (
    cluster_table,
    console,
    metrics_endpoints,
    registered,
    set_appendfsync,
    show,
    spark_servers_option,
    spawn,
    start_cluster,
    stop_cluster,
    task_partition_args,
    wait_for,
)
from .options import setting_option

appendfsync_option = setting_option("redis_appendfsync")
"""``--appendfsync``, as ``cluster up`` and ``cluster start`` both take it."""


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
@appendfsync_option
@spark_servers_option
@click.pass_obj
def up(obj: Context, taskmanagers: int, slots: int, hold: bool) -> None:
    """Start the embedded cluster, show it once every TaskManager registered, then stop it."""
    started = time.monotonic()
    obj.start("cluster")
    set_appendfsync(obj)
    cluster, log, _ = start_cluster(obj, taskmanagers, slots, detach=False)
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
        stop_cluster(cluster, log)
    show(*cluster_table_offline(obj), title="after stop")
    console.print("stopped cleanly")


def cluster_table_offline(obj: Context) -> tuple[dict, dict]:
    """Read the tables of a stopped embedded cluster (Redis comes back on its data)."""
    fresh = Context(obj.settings)
    return cluster_table(fresh.log())


@cluster.command()
@click.option("--taskmanagers", "-n", default=2, show_default=True, type=click.IntRange(0, 64))
@click.option("--slots", "-s", default=2, show_default=True, type=click.IntRange(1, 1024))
@appendfsync_option
@spark_servers_option
@click.pass_obj
def start(obj: Context, taskmanagers: int, slots: int) -> None:
    """Start the embedded cluster in the background (stop it with `sluice cluster stop`)."""
    obj.start("cluster")
    set_appendfsync(obj)
    cluster, log, _ = start_cluster(obj, taskmanagers, slots, detach=True)
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
    with console.status(
        "building Spark's class-data archive (a Spark server runs a sample job, then writes the "
        "classes it loaded as it exits)"
    ):
        took = build_class_archive(archive)
    console.print(f"built {archive} ({archive.stat().st_size / 1e6:,.0f} MB) in {took:.0f} s", soft_wrap=True)


@cluster.command()
@click.pass_obj
def stop(obj: Context) -> None:
    """Stop the background embedded cluster (TaskManagers unregister first). If its Redis is
    dead, every process it started still goes (SIGTERM, then SIGKILL)."""
    cluster = obj.cluster
    stop_cluster(cluster, obj.log() if _redis_answers(obj) else None)
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
        share = task_partition_args(cluster, total)
        new = [
            spawn(cluster, "taskmanager", url, "--slots", str(slots), *share)
            for _ in range(taskmanagers - len(running))
        ]
        names = {t.name for t in new}
        leader, tms = wait_for(
            log, lambda leader, rows: registered(rows, names), f"waiting for {len(new)} new TaskManagers"
        )
    elif taskmanagers < len(running):
        going = running[taskmanagers:]
        names = {t.name for t in going}
        cluster.terminate(going)
        leader, tms = wait_for(
            log,
            lambda leader, rows: all(rows.get(n, {}).get("status") != "REGISTERED" for n in names),
            f"waiting for {len(going)} TaskManagers to leave",
        )
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
        why = (
            ("its process is gone" if pid and not alive(int(pid)) else "its process runs but does not answer")
            if pid
            else "none is recorded"
        )
        click.secho(
            f"error: the embedded cluster's Redis {redact(rec.get('url', ''))} is away ({why}); still running:",
            fg="red",
            err=True,
        )
        for p in running:
            click.echo(f"  {p.role} {p.name} (pid {p.pid})", err=True)
        click.echo(
            "`sluice cluster stop` stops them; `sluice cluster start` starts the cluster again on its data", err=True
        )
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
            console.print(
                "embedded cluster processes running: "
                + ", ".join(f"{p['role']} {p['name']} (pid {p['pid']})" for p in procs),
                soft_wrap=True,
            )
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
