"""``sluice replay``: time travel over the log (see sluice/views/replay.py).

``sluice replay [--job J | --cluster] [--until ENTRY_ID|TIME]`` prints the ExecutionGraph,
KvStateLocation, TaskManager and job tables as they were then (``--json``: one object,
see ``rebuild_json``); ``--into PREFIX`` writes them (and the facts up to then) under a
fresh prefix instead; ``--check`` compares a full rebuild with the projector's live tables
and exits 0 when they agree, 1 when they differ, 2 on an error.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import click
import orjson
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sluice.errors import SluiceError
from sluice.store import EventLog, Keys

from .context import Context

__all__ = ["register"]

console = Console(highlight=False, emoji=False, soft_wrap=True)


@click.command()
@click.option("--job", "job_id", default=None, metavar="J", help="Only this job's tables.")
@click.option("--cluster", "cluster_only", is_flag=True, help="Only the cluster's tables (TaskManagers, leader, jobs).")
@click.option(
    "--until",
    "until",
    default=None,
    metavar="ENTRY_ID|TIME",
    help="The moment: an entry id, milliseconds since the epoch or an ISO 8601 time (default: now).",
)
@click.option(
    "--into",
    "into",
    default=None,
    metavar="PREFIX",
    help="Write the tables (and the facts up to the moment) under this fresh prefix.",
)
@click.option(
    "--check",
    "check_live",
    is_flag=True,
    help="Compare a full rebuild with the live tables; exit 0 if they agree, 1 if not, 2 on an error.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def replay(
    obj: Context,
    job_id: str | None,
    cluster_only: bool,
    until: str | None,
    into: str | None,
    check_live: bool,
    as_json: bool,
) -> None:
    """Rebuild the tables from the log as they were at a moment (default: now)."""
    if job_id is not None and cluster_only:
        raise click.UsageError("--job and --cluster exclude each other: leave both out for the cluster and every job")
    if check_live:
        if until is not None or into is not None:
            raise click.UsageError(
                "--check compares a full rebuild with the live tables: it takes no --until or --into"
            )
        try:
            sys.exit(_check(obj.log(), job_id, cluster_only, as_json))
        except SluiceError as exc:
            click.secho(f"error: {exc}", fg="red", err=True)
            sys.exit(2)
    from sluice.errors import BadMoment
    from sluice.views.history import resolve_at
    from sluice.views.replay import rebuild, rebuild_json, write_into

    try:
        at = resolve_at(until)
    except BadMoment as exc:
        raise click.BadParameter(str(exc).replace("--at ", "", 1), param_hint="--until") from None
    log = obj.log()
    built = rebuild(log, at, job=job_id, cluster=cluster_only)
    if into is not None:
        target = EventLog(log.backend, Keys(into))
        copied = write_into(log, target, built)
        if as_json:
            click.echo(orjson.dumps({"into": into, "at": at.entry, "facts": copied}).decode())
        else:
            click.echo(
                f"rebuilt {_what(built)} {_when(at.said)} into prefix {into!r} "
                f"({sum(copied.values())} facts copied); look with `sluice --prefix {into} status` "
                f"or `sluice --prefix {into} inspect tail`"
            )
        return
    data = rebuild_json(log, built)
    if as_json:
        click.echo(orjson.dumps(data).decode())
    else:
        show(data)


def _what(built: Any) -> str:
    parts = ["the cluster"] if built.cluster is not None else []
    parts += [f"job {j.job_id}" for j in built.jobs]
    return ", ".join(parts) or "nothing"


def _when(said: str | None) -> str:
    return f"as of {said}" if said else "as of now"


def _check(log: EventLog, job_id: str | None, cluster_only: bool, as_json: bool) -> int:
    from sluice.views.replay import check

    result = check(log, job=job_id, cluster=cluster_only)
    if as_json:
        click.echo(orjson.dumps(result.to_json()).decode())
        return 0 if result.agree else 1
    for t in result.tables:
        where = "not projected yet" if t.position is None else f"at {t.position}"
        lag = "up to date" if t.lag == 0 else f"[yellow]{t.lag} fact(s) behind the log[/] (at {t.log_end})"
        console.print(f"{escape(t.scope)} {t.table}: {where}, {lag}")
    for d in result.differences:
        console.print(
            f"[red]differs[/] {escape(d.scope)} {d.table} {escape(d.key)} {escape(d.field)}: "
            f"live {escape(_short(d.live))} vs rebuilt {escape(_short(d.rebuilt))}"
        )
    behind = sum(1 for t in result.tables if t.lag)
    if result.agree:
        console.print(
            f"[green]agree[/]: {len(result.tables)} table(s) equal a rebuild at their position"
            + (f"; {behind} lag the log" if behind else "")
        )
        return 0
    console.print(f"[red]{len(result.differences)} difference(s)[/] between the live tables and a rebuild")
    return 1


def _short(value: Any) -> str:
    text = orjson.dumps(value).decode()
    return text if len(text) <= 120 else text[:117] + "..."


def _time(ms: Any) -> str:
    if not isinstance(ms, int):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def show(data: dict[str, Any]) -> None:
    """The rebuild, as tables."""
    at = data["at"]
    shown = f" (entry {at['entry']})" if at["entry"] and at["entry"] != at["said"] else ""
    console.print(f"[bold]as of {escape(at['said'] or 'now')}[/]{shown}")
    cluster = data.get("cluster")
    if cluster is not None:
        t = cluster["tables"]
        leader = t["leadership"].get("leader")
        console.print(
            f"cluster: {cluster['facts']} fact(s) up to {cluster['position'] or '-'}; leader: "
            + (f"{escape(str(leader['leader_id']))} (epoch {leader['epoch']})" if leader else "none")
        )
        tms = Table("TaskManager", "host", "slots", "status", "since", "reason", title="TaskManagers")
        for rid, row in t["taskmanagers"].items():
            tms.add_row(
                escape(rid),
                escape(row["host"]),
                str(row["slots"]),
                row["status"],
                _time(row["since"]),
                escape(row.get("reason") or ""),
            )
        console.print(tms)
        jobs = Table("job", "name", "registered", title="jobs")
        for jid, row in t["jobs"].items():
            jobs.add_row(escape(jid), escape(row["name"]), _time(row["registered_at"]))
        console.print(jobs)
    for jid, job in data["jobs"].items():
        show_job(jid, job)


def show_job(jid: str, job: dict[str, Any]) -> None:
    graph = dict(job["tables"]["executiongraph"])
    head = graph.pop("job", None)
    if head is None:
        console.print(f"job {escape(jid)}: not submitted yet ({job['facts']} fact(s))")
        return
    console.print(
        f"job {escape(jid)} ({escape(head['name'])}): [bold]{head['status']}[/], {head['restarts']} "
        f"restart(s); {job['facts']} fact(s) up to {job['position']}"
    )
    subtasks = Table(
        "subtask", "attempt", "state", "TaskManager", "slot", "since", "error", title=f"ExecutionGraph of {escape(jid)}"
    )
    for key, row in graph.items():
        error = (row.get("error") or "").strip().splitlines()
        subtasks.add_row(
            escape(key),
            str(row["attempt"]),
            row["state"],
            escape(row["taskmanager"] or "-"),
            "-" if row["slot"] is None else str(row["slot"]),
            _time(row["since"]),
            escape(error[-1] if error else ""),
        )
    console.print(subtasks)
    kv = job["tables"]["kvstate"]
    if kv:
        locations = Table(
            "name", "vertex", "key groups", "registered", "ranges", title=f"KvStateLocation of {escape(jid)}"
        )
        for name, row in kv.items():
            ranges = ", ".join(f"{r['start']}-{r['end']}@{r['address']}" for r in row["ranges"])
            locations.add_row(
                escape(name),
                escape(row["vertex"]),
                str(row["num_key_groups"]),
                str(row["registered_key_groups"]),
                escape(ranges),
            )
        console.print(locations)
    if head["status"] in ("FAILED", "FAILING") and head.get("reason"):
        console.print("[red]root cause:[/]")
        console.print(head["reason"], markup=False)


def register(cli: click.Group) -> None:
    cli.add_command(replay)
