"""``sluice ui``: the web dashboard (jobs, a job's DAG, attempts, Gantt and time slider,
TaskManagers, streams, queryable state), served with Starlette under uvicorn."""

from __future__ import annotations

import os

import click

from .context import Context
from .options import setting_options

TOKEN_ENV = "SLUICE_UI_TOKEN"

__all__ = ["register", "ui"]


@click.command()
@setting_options("ui_port", "ui_host")
@click.option(
    "--token-env",
    default=TOKEN_ENV,
    show_default=True,
    metavar="NAME",
    help="Environment variable holding the token that allows cancelling jobs from the "
    "dashboard (POST with Authorization: Bearer TOKEN); the default one may also come from "
    "ui_token in the settings file. Unset: read-only.",
)
@click.pass_obj
def ui(obj: Context, token_env: str) -> None:
    """Serve the web dashboard until interrupted."""
    s = obj.start("ui")
    from sluice.ui.app import create_app
    from sluice.ui.serve import UiServer, bind

    token = s.secret("ui_token") if token_env == TOKEN_ENV else os.environ.get(token_env) or None
    sock = bind(s.ui_host, s.ui_port)  # a port in use is refused here, before anything starts
    app = create_app(obj.log(), token=token, token_env=token_env)
    server = UiServer(app, sock)
    where = server.url + "/"
    mode = (
        f"cancelling allowed with the token in ${token_env}"
        if token
        else f"read-only (set ${token_env} to allow cancelling)"
    )
    click.echo(f"Sluice dashboard on {where} ({mode}); Ctrl-C stops it")
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn has shut down and re-raised the Ctrl-C it caught
        pass
    click.echo("dashboard stopped")


def register(cli: click.Group) -> None:
    cli.add_command(ui)
