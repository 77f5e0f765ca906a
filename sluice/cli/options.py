"""Options that set a setting: each is declared once, on the field of ``sluice.config.Settings``
(its flag, the commands that take it, what it means); ``setting_option(NAME)`` makes the click
option. Its value is not handed to the command: it goes, as a flag, to the one settings object
(``Context.settings``), which weighs it against the environment and the settings file."""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any, TypeVar

import click

from sluice.config import Settings, specs

__all__ = ["FLAGS", "setting_option", "setting_options", "flags_of"]

FLAGS = "sluice.flags"
"""Where the flags given are kept: ``ctx.meta[FLAGS]`` (setting name -> value), shared by the
group's context and its subcommands'."""

F = TypeVar("F", bound=Callable[..., Any])


def flags_of(ctx: click.Context) -> dict[str, Any]:
    """The settings given as flags so far on this command line (the live dict)."""
    flags: dict[str, Any] = ctx.meta.setdefault(FLAGS, {})
    return flags


def _choices(name: str) -> tuple[str, ...]:
    annotation = Settings.model_fields[name].annotation
    if typing.get_origin(annotation) is typing.Literal:
        return tuple(str(a) for a in typing.get_args(annotation))
    return ()


def _shown_default(name: str) -> str:
    value = Settings.model_fields[name].default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def setting_option(name: str) -> Callable[[F], F]:
    """The click option of the setting ``name`` (its flag and aliases, as declared)."""
    spec = specs()[name]
    if spec.flag is None:
        raise ValueError(f"the setting {name} has no flag")

    def record(ctx: click.Context, _param: click.Parameter, value: Any) -> Any:
        if value is not None:
            flags_of(ctx)[name] = value
        return value

    choices = _choices(name)
    metavar = "[" + "|".join(choices) + "]" if choices else spec.metavar or None
    return click.option(
        f"setting_{name}",
        spec.flag,
        *spec.aliases,
        default=None,
        expose_value=False,
        is_eager=False,
        callback=record,
        metavar=None if spec.is_bool else metavar,
        help=f"{spec.meaning[0].upper()}{spec.meaning[1:]}. [${spec.env}; {name} in the settings file; "
        f"default: {_shown_default(name)}]",
    )


def setting_options(*names: str) -> Callable[[F], F]:
    """``setting_option`` of each of ``names``, shown in that order."""

    def add(f: F) -> F:
        for name in reversed(names):
            f = setting_option(name)(f)
        return f

    return add
