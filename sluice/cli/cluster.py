"""The embedded cluster: ``sluice cluster up|start|stop``, ``sluice scale``, ``sluice status``."""

from __future__ import annotations

import time

import click
import orjson
from rich.console import Console
from rich.table import Table

from sluice.errors import ServiceError
from sluice.services.embedded import EmbeddedCluster
from sluice.services.projector import Projector
from sluice.store import EventLog, ReadModels

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


def _start(obj: Context, taskmanagers: int, slots: int, detach: bool) -> tuple[EmbeddedCluster, EventLog, list]:
    cluster = obj.cluster
    if cluster.processes("jobmanager"):
        raise ServiceError(f"an embedded cluster already runs in {cluster.home}; `sluice cluster stop` it first")
    url = cluster.redis_url(detach=detach)
    log = obj.log()
    cluster.spawn("projector", url, detach=detach)
    cluster.spawn("jobmanager", url, detach=detach)
    tms = [cluster.spawn("taskmanager", url, "--slots", str(slots), detach=detach) for _ in range(taskmanagers)]
    names = {t.name for t in tms}
    wait_for(log, lambda leader, rows: bool(leader) and _registered(rows, names),
             f"waiting for {taskmanagers} TaskManagers to register")
    return cluster, log, tms


def _stop(cluster: EmbeddedCluster, log: EventLog) -> None:
    tms = cluster.processes("taskmanager")
    names = {t.name for t in tms}
    cluster.terminate(tms)
    try:
        wait_for(log, lambda leader, rows: all(rows.get(n, {}).get("status") != "REGISTERED" for n in names),
                 "waiting for TaskManagers to unregister", timeout=15)
    except ServiceError as exc:
        console.print(f"[yellow]{exc}[/]")
    cluster.terminate(cluster.processes())
    cluster.stop_redis()


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
@click.pass_obj
def up(obj: Context, taskmanagers: int, slots: int, hold: bool, appendfsync: str | None) -> None:
    """Start the embedded cluster, show it once every TaskManager registered, then stop it."""
    started = time.monotonic()
    _fsync(obj, appendfsync)
    cluster, log, _ = _start(obj, taskmanagers, slots, detach=False)
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
@click.pass_obj
def start(obj: Context, taskmanagers: int, slots: int, appendfsync: str | None) -> None:
    """Start the embedded cluster in the background (stop it with `sluice cluster stop`)."""
    _fsync(obj, appendfsync)
    cluster, log, _ = _start(obj, taskmanagers, slots, detach=True)
    show(*cluster_table(log))
    console.print(f"running in the background; Redis at {cluster.redis_url(start=False)}")


@cluster.command()
@click.pass_obj
def stop(obj: Context) -> None:
    """Stop the background embedded cluster (TaskManagers unregister first)."""
    cluster = obj.cluster
    log = obj.log()
    _stop(cluster, log)
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
        new = [cluster.spawn("taskmanager", url, "--slots", str(slots)) for _ in range(taskmanagers - len(running))]
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
    Works on a stopped embedded cluster too."""
    if job_id:
        from .jobs import show_job, table_json

        job = table_json(obj.log(), job_id)
        if as_json:
            click.echo(orjson.dumps(job, option=orjson.OPT_INDENT_2).decode())
        else:
            show_job(job)
        return
    leader, tms = cluster_table(obj.log())
    if as_json:
        click.echo(orjson.dumps({"leader": leader or None, "taskmanagers": sorted(tms.values(), key=lambda r: r["resource_id"])},
                                option=orjson.OPT_INDENT_2).decode())
    else:
        show(leader, tms)


def register(cli: click.Group) -> None:
    cli.add_command(cluster)
    cli.add_command(scale)
    cli.add_command(status)
