"""``sluice job export JOB FILE`` and ``sluice job import FILE [--prefix P]``: a job's log
as a JSON-lines file someone else can load and replay (format: sluice/views/archive.py)."""

from __future__ import annotations

import time
from pathlib import Path

import click

from sluice.errors import SluiceError
from sluice.store import EventLog, Keys

from .context import Context

__all__ = ["export_job", "import_job"]


@click.command("export")
@click.argument("job_id")
@click.argument("file", type=click.Path(dir_okay=False, writable=True, path_type=Path))
@click.pass_obj
def export_job(obj: Context, job_id: str, file: Path) -> None:
    """Write job JOB_ID's streams, the cluster facts about it and its code to FILE (JSON lines)."""
    from sluice.views.archive import collect, export_lines

    export = collect(obj.log(), job_id)
    lines = export_lines(export, exported_at=int(time.time() * 1000))
    try:
        with file.open("w", encoding="utf-8") as out:
            for line in lines:
                out.write(line + "\n")
    except OSError as exc:
        raise SluiceError(f"cannot write the export to {file}: {exc.strerror or exc}") from None
    counts = export.counts()
    click.echo(
        f"job {job_id} exported to {file}: {counts['entries']} entries of {len(counts['streams'])} "
        f"stream(s), {counts['blobs']} code blob(s); load it with `sluice job import {file}`"
    )
    for digest in export.missing_blobs:
        click.secho(
            f"warning: the job's code blob {digest} is not in the store; exported without it", fg="yellow", err=True
        )


@click.command("import")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--prefix",
    "prefix",
    default=None,
    metavar="P",
    help="A fresh prefix to load it under (default: import-<job>-<n>, the first free one).",
)
@click.pass_obj
def import_job(obj: Context, file: Path, prefix: str | None) -> None:
    """Load an export under a fresh prefix, where inspect, replay and the dashboard work."""
    from sluice.views.archive import free_prefix, load, parse

    try:
        with file.open("rb") as f:
            export = parse(f, str(file))
    except OSError as exc:
        raise SluiceError(f"cannot read {file}: {exc.strerror or exc}") from None
    log = obj.log()
    target = (
        EventLog(log.backend, Keys(prefix))
        if prefix is not None
        else free_prefix(log, export.job_id, lambda p: EventLog(log.backend, Keys(p)))
    )
    written = load(target, export)
    p = target.keys.prefix
    click.echo(
        f"job {export.job_id} (exported from prefix {export.prefix!r}) imported under prefix {p!r}: "
        f"{sum(written.values())} entries, {len(export.blobs)} code blob(s)"
    )
    click.echo(
        f"look at it with `sluice --prefix {p} status {export.job_id}`, "
        f"`sluice --prefix {p} inspect tail`, `sluice --prefix {p} replay --job {export.job_id}`"
    )
