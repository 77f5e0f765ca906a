"""``sluice``: run the cluster's processes, look at the log, manage the embedded cluster."""

from __future__ import annotations

import sys

import click

from sluice import __version__
from sluice.config import Settings
from sluice.errors import SluiceError

from .context import Context

__all__ = ["main", "cli", "run_command"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--redis",
    "redis_url",
    envvar="SLUICE_REDIS_URL",
    default=None,
    metavar="URL",
    help="Redis URL (redis://, rediss:// for TLS; user in the URL, password from "
    "$SLUICE_REDIS_PASSWORD). Default: the embedded Redis in --home.",
)
@click.option(
    "--prefix", envvar="SLUICE_PREFIX", default="sluice", show_default=True, help="Prefix of every Redis key."
)
@click.option(
    "--home",
    envvar="SLUICE_HOME",
    default=".sluice",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Data directory of the embedded cluster.",
)
@click.version_option(__version__, prog_name="sluice")
@click.pass_context
def cli(ctx: click.Context, redis_url: str | None, prefix: str, home: str) -> None:
    """Sluice: Flink's runtime control plane for PySpark pipelines, on Redis streams."""
    from pathlib import Path

    from sluice.services.common.shell import configure_logging

    configure_logging()
    ctx.obj = Context(Settings(redis_url=redis_url, prefix=prefix, home=Path(home)))


@cli.command(
    "bench",
    hidden=True,
    add_help_option=False,
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
)
def bench() -> None:
    """Moved: the benchmarks run from a source checkout (scripts/bench)."""
    raise click.ClickException(
        "the benchmarks are not part of the installed sluice command: they run from a source checkout of "
        "Sluice, as `scripts/bench NAME [OPTIONS]` (the same names and options; `scripts/bench --help` lists them)"
    )


def _register() -> None:
    from . import cluster, health, inspect, jobs, processes, replay, state, ui

    for module in (cluster, processes, inspect, jobs, state, replay, ui, health):
        module.register(cli)


def main() -> None:
    _register()
    run_command(cli)


def run_command(command: click.Command, **kwargs: object) -> None:
    """Run a click command as ``sluice`` does: a usage error shown with its exit code, a Sluice
    error as one red line (exit 1), Ctrl-C as exit 130, never a traceback for either."""
    try:
        command(standalone_mode=False, **kwargs)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except SluiceError as exc:
        click.secho(f"error: {exc}", fg="red", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
