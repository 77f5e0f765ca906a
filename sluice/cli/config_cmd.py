"""``sluice config show``: the settings in effect and where each came from."""

from __future__ import annotations

from typing import Any

import click
import orjson
from pydantic import SecretStr

from sluice.config import Resolved, specs
from sluice.store.connection import redact

from .context import Context

__all__ = ["config", "register", "shown"]

REDACTED = "***"


def shown(resolved: Resolved, name: str) -> Any:
    """``name``'s value as `config show` prints it: a secret as ``***`` (None when unset), a
    URL without its password, a path as text."""
    value = getattr(resolved.settings, name)
    if value is None:
        return None
    if isinstance(value, SecretStr) or specs()[name].secret:
        return REDACTED
    if isinstance(value, str) and "://" in value:
        return redact(value)
    if isinstance(value, (bool, int, float)):
        return value
    return str(value)


@click.group()
def config() -> None:
    """The settings: flags beat SLUICE_* variables, which beat the settings file (--config, or
    sluice.toml in the home), which beats the defaults."""


@config.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON: each setting's value, source, variable and key.")
@click.pass_obj
def show(obj: Context, as_json: bool) -> None:
    """Print the settings in effect and where each came from (flag, env, file PATH or
    default); secrets are redacted. A bad value is refused, naming the setting."""
    resolved = obj.resolved
    all_specs = specs()
    if as_json:
        body = {
            "file": str(resolved.file) if resolved.file else None,
            "settings": {
                name: {
                    "value": shown(resolved, name),
                    "source": resolved.origin[name],
                    "flag": spec.flag,
                    "env": spec.env,
                    "key": spec.key,
                }
                for name, spec in all_specs.items()
            },
        }
        click.echo(orjson.dumps(body, option=orjson.OPT_INDENT_2).decode())
        return
    rows = [(name, _text(shown(resolved, name)), resolved.source(name)) for name in all_specs]
    width = max(len(n) for n, _, _ in rows)
    value_width = min(48, max(len(v) for _, v, _ in rows))
    click.echo(f"settings file: {resolved.file or 'none'}")
    for name, value, source in rows:
        click.echo(f"{name:<{width}}  {value:<{value_width}}  ({source})")


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def register(cli: click.Group) -> None:
    cli.add_command(config)
