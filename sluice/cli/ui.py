"""``sluice ui``: the web dashboard (jobs, a job's DAG, attempts, Gantt and time slider,
TaskManagers, streams, queryable state), served with Starlette under uvicorn."""

from __future__ import annotations

import os

import click

from sluice.config import host_setting

from .context import Context

__all__ = ["register", "ui"]


@click.command()
@click.option(
    "--port",
    default=8087,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Port to listen on (0: any free port).",
)
@click.option(
    "--host",
    envvar="SLUICE_UI_HOST",
    default="127.0.0.1",
    show_default=True,
    metavar="ADDRESS",
    callback=lambda _ctx, _param, value: host_setting(value, "--host ($SLUICE_UI_HOST)"),
    help="Address to listen on, $SLUICE_UI_HOST (0.0.0.0 to serve other machines: plain HTTP, so put "
    "a TLS proxy in front before allowing cancels there).",
)
@click.option(
    "--token-env",
    default="SLUICE_UI_TOKEN",
    show_default=True,
    metavar="NAME",
    help="Environment variable holding the token that allows cancelling jobs from the "
    "dashboard (POST with Authorization: Bearer TOKEN). Unset: read-only.",
)
@click.pass_obj
def ui(obj: Context, port: int, host: str, token_env: str) -> None:
    """Serve the web dashboard until interrupted."""
    from sluice.ui.app import create_app
    from sluice.ui.serve import UiServer, bind

    token = os.environ.get(token_env) or None
    sock = bind(host, port)  # a port in use is refused here, before anything starts
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
