"""Queryable state from the command line: ``sluice state get JOB NAME KEY`` and
``sluice job dispose JOB``; the ``job`` group also holds ``purge`` (an ended job's keys
removed, a tombstone left), ``export`` and ``import`` (sluice/cli/job_archive.py).

``sluice state get JOB NAME KEY --json`` prints one object (stable)::

    {"job_id", "name", "key", "key_group", "vertex", "state_id", "address", "value"}

where ``value`` is the key's row as JSON (null when the key has no value; the exit code is
then 1). ``--type long`` looks the key up as an integer (a LongType key column).

A finished job's state stays queryable until ``sluice job dispose JOB`` releases it (its
locations are unregistered and the state deleted; the job's log stays). Disposing needs a
JobManager: with the embedded cluster stopped, the command leads for the moment it takes.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import Any

import click
import orjson

from sluice.errors import ConfigError

from .context import Context

__all__ = ["register"]


@click.group()
def state() -> None:
    """Queryable state that keyed vertices publish (key_by(...).map(..., queryable="name"))."""


@state.command()
@click.argument("job_id")
@click.argument("name")
@click.argument("key")
@click.option(
    "--type",
    "key_type",
    type=click.Choice(["string", "long"]),
    default="string",
    show_default=True,
    help="The key column's type (the key group depends on it).",
)
@click.option("--json", "as_json", is_flag=True, help="Print where the value was found, as JSON.")
@click.pass_obj
def get(obj: Context, job_id: str, name: str, key: str, key_type: str, as_json: bool) -> None:
    """The value of KEY under NAME in job JOB_ID."""
    from sluice.state import StateClient

    typed: object = key
    if key_type == "long":
        try:
            typed = int(key)
        except ValueError:
            raise ConfigError(f"--type long needs an integer key, got {key!r}") from None
    found = StateClient(obj.log()).lookup(job_id, name, typed)
    if as_json:
        click.echo(
            orjson.dumps(
                {
                    "job_id": found.job_id,
                    "name": found.name,
                    "key": found.key,
                    "key_group": found.key_group,
                    "vertex": found.vertex,
                    "state_id": found.state_id,
                    "address": found.address,
                    "value": found.value,
                }
            ).decode()
        )
    elif found.value is not None:
        click.echo(orjson.dumps(found.value).decode())
    if found.value is None:
        click.secho(
            f"no value for key {key!r} under {name!r} in job {job_id} (key group {found.key_group}, "
            f"vertex {found.vertex!r})",
            fg="yellow",
            err=True,
        )
        sys.exit(1)


@click.group()
def job() -> None:
    """One job's lifecycle beyond running it."""


@contextlib.contextmanager
def leading(obj: Context, log: Any) -> Iterator[None]:
    """A JobManager leads inside (on a stopped embedded cluster: this process's, for the
    moment a request to the leader takes)."""
    from sluice.store import current_leader

    stop, runner = threading.Event(), None
    if current_leader(log) is None and obj.settings.redis_url is None:
        from sluice.services.jobmanager import JobManager

        jm = JobManager(log, lease_ttl_ms=obj.settings.lease_ttl_ms)
        runner = threading.Thread(target=jm.run, args=(stop,), name="jobmanager", daemon=True)
        runner.start()
    try:
        yield
    finally:
        stop.set()
        if runner is not None:
            runner.join(timeout=10)


@job.command()
@click.argument("job_id")
@click.pass_obj
def purge(obj: Context, job_id: str) -> None:
    """Remove an ended job's keys entirely (facts, snapshots, tables, streams), leaving one
    tombstone row: `sluice status JOB` then says when it was purged and how it had ended."""
    from sluice.client import Client

    log = obj.log()
    with leading(obj, log):
        done = Client(log).purge(job_id)
    click.echo(f"job {job_id} ({done.name}) purged: it had ended {done.status.value}; its id stays taken")


@job.command()
@click.argument("job_id")
@click.pass_obj
def dispose(obj: Context, job_id: str) -> None:
    """Release an ended job's queryable state (locations and data; the log stays)."""
    from sluice.state import StateClient

    log = obj.log()
    with leading(obj, log):
        done = StateClient(log).dispose(job_id)
    names = ", ".join(map(repr, done.names)) or "no queryable state"
    click.echo(f"job {job_id} disposed: {names} released, {len(done.state_ids)} state instance(s) deleted")


def register(cli: click.Group) -> None:
    from .job_archive import export_job, import_job

    job.add_command(export_job)
    job.add_command(import_job)
    cli.add_command(state)
    cli.add_command(job)
