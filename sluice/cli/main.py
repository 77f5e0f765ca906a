"""``sluice``: run the cluster's processes, look at the log, manage the embedded cluster."""

from __future__ import annotations

import sys

import click

from sluice import __version__
from sluice.config import CONFIG_ENV, CONFIG_FILE, specs
from sluice.errors import SluiceError

from .context import Context
from .options import flags_of, setting_options

__all__ = ["main", "cli", "run_command"]


GLOBAL_SETTINGS = [name for name, spec in specs().items() if spec.flag and not spec.commands]
"""The settings every command takes as a flag (the others: the commands their flags are on)."""


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    "config",
    default=None,
    metavar="PATH",
    help=f"The settings file (TOML; ${CONFIG_ENV}). Default: {CONFIG_FILE} in the home folder, if there is one. "
    "A flag beats a SLUICE_* variable, which beats the file (`sluice config show` says what came from where).",
)
@setting_options(*GLOBAL_SETTINGS)
@click.version_option(__version__, prog_name="sluice")
@click.pass_context
def cli(ctx: click.Context, config: str | None) -> None:
    """Sluice: Flink's runtime control plane for PySpark pipelines, on Redis streams."""
    from sluice.services.common.shell import configure_logging

    configure_logging()
    obj = Context(flags=flags_of(ctx), config=config)
    ctx.call_on_close(obj.close)
    ctx.obj = obj


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
    from . import cluster, config_cmd, health, inspect, jobs, processes, replay, state, ui

    for module in (cluster, processes, inspect, jobs, state, replay, ui, config_cmd, health):
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
