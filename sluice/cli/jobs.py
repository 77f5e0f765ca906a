"""Jobs from the command line: ``sluice run``, ``submit``, ``list``, ``cancel``, ``status JOB``.

``--json`` output (stable): ``sluice status JOB --json`` prints one object::

    {"job_id", "name", "status", "reason", "submitted_at", "ended_at", "restarts",
     "vertices": [{"name", "parallelism", "states": {STATE: count},
                   "subtasks": [{"subtask", "attempt", "state", "taskmanager", "slot", "since", "error"}]}],
     "outputs": [sink paths]}

and ``sluice list --json`` a list of ``{"job_id", "name", "status", "submitted_at", "ended_at"}``.
Times are milliseconds since the epoch. A purged job (``sluice job purge``) has status
``PURGED``, with ``was`` (how it had ended) and ``purged_at``, and no vertices.
"""

from __future__ import annotations

import sys
import time
from collections import Counter

import click
import orjson
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from sluice.client import Client, load_job
from sluice.errors import ConfigError, SluiceError
from sluice.errors_display import short_traceback
from sluice.events import JobStatus
from sluice.services.jobs.state import TERMINAL_JOB, JobRun

from .context import Context
from .embedded import spark_servers_option, start_cluster, stop_cluster

console = Console(emoji=False, highlight=False)

EXIT = {JobStatus.FINISHED: 0, JobStatus.FAILED: 1, JobStatus.CANCELED: 3}


def parse_params(pairs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep or not key:
            raise ConfigError(f"--param {p!r} must look like key=value")
        out[key] = value
    return out


def job_json(job: JobRun) -> dict:
    return {
        "job_id": job.job_id,
        "name": job.name,
        "status": job.status.value,
        "reason": job.reason,
        "submitted_at": job.submitted_at,
        "ended_at": job.ended_at,
        "restarts": job.restarts,
        "vertices": [
            {
                "name": name,
                "parallelism": len(v.subtasks),
                "states": dict(Counter(ex.state.value for ex in v.subtasks)),
                "subtasks": [
                    {
                        "subtask": ex.subtask,
                        "attempt": ex.attempt,
                        "state": ex.state.value,
                        "taskmanager": ex.taskmanager,
                        "slot": ex.slot,
                        "since": ex.since,
                        "error": ex.error,
                    }
                    for ex in v.subtasks
                ],
            }
            for name, v in job.vertices.items()
        ],
        "outputs": [v.spec.sink.path for v in job.vertices.values() if v.spec.sink is not None],
    }


def table_json(log, job_id: str) -> dict:
    """The job's ExecutionGraph from the projector's table (brought up to date first)."""
    from sluice.client import JobNotFound
    from sluice.services.projector import Projector
    from sluice.store import ReadModels
    from sluice.store.purge import Tombstones

    tomb = Tombstones(log).read(job_id)
    if tomb is not None:
        return purged_json(job_id, tomb)
    Projector(log).catch_up()
    _, rows = ReadModels(log).read(log.keys.job(job_id), "executiongraph")
    job = rows.pop("job", None)
    if job is None:
        raise JobNotFound(f"job not found: {job_id} (no such job in this cluster; `sluice list` shows the jobs)")
    by_vertex: dict[str, list] = {}
    for row in rows.values():
        by_vertex.setdefault(row["vertex"], []).append(row)
    for v in job["vertices"]:
        v["subtasks"] = sorted(
            ({k: r[k] for k in r if k != "vertex"} for r in by_vertex.get(v["name"], [])), key=lambda r: r["subtask"]
        )
    job.pop("waiting_since", None)
    return job


def purged_json(job_id: str, tomb: dict) -> dict:
    """What ``status`` says of a purged job: its tombstone (``was``: how it had ended)."""
    return {
        "job_id": job_id,
        "name": tomb.get("name", ""),
        "status": "PURGED",
        "was": tomb.get("status"),
        "reason": tomb.get("reason"),
        "submitted_at": None,
        "ended_at": tomb.get("ended_at"),
        "purged_at": tomb.get("purged_at"),
        "restarts": 0,
        "vertices": [],
        "outputs": [],
    }


def show_job(job: dict) -> None:
    if job["status"] == "PURGED":
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime((job["purged_at"] or 0) / 1000))
        console.print(
            f"job {job['job_id']} ({job['name']}): purged at {at}, was {job['was']}; its keys are gone",
            soft_wrap=True,
            markup=False,
        )
        return
    now = int(time.time() * 1000)
    took = ((job["ended_at"] or now) - job["submitted_at"]) / 1000
    color = {"FINISHED": "green", "FAILED": "red", "CANCELED": "yellow"}.get(job["status"], "cyan")
    console.print(
        f"job {job['job_id']} ({job['name']}): [{color}]{job['status']}[/] after {took:.1f} s, "
        f"{job['restarts']} restart(s)",
        soft_wrap=True,
    )
    for v in job["vertices"]:
        console.print(
            f"  {v['name']}: " + ", ".join(f"{n} {s}" for s, n in sorted(v["states"].items())),
            soft_wrap=True,
            markup=False,
        )
    for path in job["outputs"]:
        console.print(f"  output: {path}", soft_wrap=True, markup=False)
    if job["status"] in ("FAILED", "FAILING") and job["reason"]:
        console.print("[red]root cause:[/]", soft_wrap=True)
        console.print(
            short_traceback(job["reason"], hint=f"`sluice status {job['job_id']} --json`"), soft_wrap=True, markup=False
        )


def follow(client: Client, job_id: str) -> JobRun:
    """A live progress bar (tasks finished / total per vertex) until the job ends."""
    job = client.job(job_id, missing_ok=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        bars: dict[str, TaskID] = {}
        while True:
            job = client.job(job_id, missing_ok=True)
            if job is not None:
                for name, v in job.vertices.items():
                    if name not in bars:
                        bars[name] = progress.add_task(name, total=len(v.subtasks))
                    progress.update(bars[name], completed=v.finished)
                if job.status in TERMINAL_JOB:
                    return job
            time.sleep(0.2)


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--param", "-p", "params", multiple=True, metavar="KEY=VALUE", help="A job parameter (repeatable).")
@click.option("--taskmanagers", "-n", default=1, show_default=True, type=click.IntRange(1, 64))
@click.option("--slots", "-s", default=2, show_default=True, type=click.IntRange(1, 64))
@spark_servers_option
@click.pass_obj
def run(obj: Context, file: str, params: tuple[str, ...], taskmanagers: int, slots: int) -> None:
    """Run a job file on the embedded cluster, with progress; exit 0 when it FINISHED."""
    obj.start("run")  # bad settings, or a home or storage root it cannot write: refused before anything starts
    job_file = load_job(file, parse_params(params))  # invalid jobs fail here, before anything starts
    started = time.monotonic()
    cluster = obj.cluster
    _, log, _ = start_cluster(obj, taskmanagers, slots, detach=False)
    try:
        client = Client(log)
        with console.status("waiting for Spark"):
            cluster.wait_spark()
        job_id = client.submit(job_file)
        console.print(
            f"submitted job {job_id} ({job_file.graph.name}) to {taskmanagers} TaskManager(s) x {slots} slots"
        )
        client.wait_accepted(job_id, timeout=120)
        job = follow(client, job_id)
    finally:
        stop_cluster(cluster, log)
    show_job(job_json(job))
    console.print(
        f"total {time.monotonic() - started:.1f} s; inspect it with `sluice status {job_id}` or "
        f"`sluice inspect tail job:{job_id}:facts`",
        soft_wrap=True,
    )
    sys.exit(EXIT.get(job.status, 1))


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--param", "-p", "params", multiple=True, metavar="KEY=VALUE", help="A job parameter (repeatable).")
@click.option(
    "--wait-running",
    is_flag=True,
    help="Also wait until every source subtask runs (with more subtasks than free slots: "
    "until the first ones finished).",
)
@click.option(
    "--wait",
    "wait_end",
    is_flag=True,
    help="Wait until the job ends, with progress; exit 0 FINISHED, 1 FAILED, 3 CANCELED.",
)
@click.option(
    "--timeout",
    default=60.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds to wait for a JobManager to accept the job (with --wait-running: for its sources to run too).",
)
@click.pass_obj
def submit(
    obj: Context, file: str, params: tuple[str, ...], wait_running: bool, wait_end: bool, timeout: float
) -> None:
    """Submit a job file to a running cluster; prints the job id once a JobManager accepted
    it (exit 1 with the reason if it refused it)."""
    job_file = load_job(file, parse_params(params))
    client = Client(obj.log())
    job_id = client.submit(job_file)
    if wait_running:
        client.wait_running(job_id, timeout)
    else:
        client.wait_accepted(job_id, timeout)
    click.echo(job_id)
    if wait_end:
        job = follow(client, job_id)
        show_job(job_json(job))
        sys.exit(EXIT.get(job.status, 1))


@click.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def list_jobs(obj: Context, as_json: bool) -> None:
    """The cluster's jobs, newest last."""
    log = obj.log()
    rows = []
    for job_id in Client(log).job_ids():
        try:
            job = table_json(log, job_id)
        except SluiceError:
            continue
        rows.append({k: job[k] for k in ("job_id", "name", "status", "submitted_at", "ended_at")})
    if as_json:
        click.echo(orjson.dumps(rows).decode())
        return
    for r in rows:
        console.print(f"{r['job_id']}  {r['status']:<10} {r['name']}")


@click.command()
@click.argument("job_id")
@click.option("--wait/--no-wait", default=True, show_default=True)
@click.pass_obj
def cancel(obj: Context, job_id: str, wait: bool) -> None:
    """Cancel a job: every task is cancelled."""
    client = Client(obj.log())
    client.cancel(job_id)
    if wait:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            job = client.job(job_id)
            if job.status in TERMINAL_JOB:
                break
            time.sleep(0.1)
    show_job(job_json(client.job(job_id)))


@click.command()
@click.argument("job_id")
@click.option("--timeout", default=30.0, show_default=True, help="Seconds to wait for the checkpoints.")
@click.pass_obj
def checkpoint(obj: Context, job_id: str, timeout: float) -> None:
    """Checkpoint every coordinator of a running job now (they are also checkpointed
    periodically); prints the checkpoints taken."""
    client = Client(obj.log())
    taken = client.checkpoint(job_id, timeout=timeout)
    for ev in taken:
        click.echo(f"{ev.operator_id}: checkpoint {ev.checkpoint_id} ({ev.released} held events released)")


def register(cli: click.Group) -> None:
    for cmd in (run, submit, list_jobs, cancel, checkpoint):
        cli.add_command(cmd)
