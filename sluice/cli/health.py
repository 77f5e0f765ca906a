"""``sluice health``: is the Sluice process in this container well? For a container's
HEALTHCHECK (the Dockerfile runs ``python -m sluice.cli.health``): one line, exit 0 when it
is, 1 with the reason when it is not.

The process is the container's main one (PID 1; ``--pid`` another): its role and port come
from its command line and environment, so one HEALTHCHECK serves every role of the image.
One HTTP request to the process's own port, on the standard library alone (about 0.1 s of
CPU, where ``sluice`` itself takes 0.6 s to start):

=============  =========================  ===================================================
role           asks                       well when
=============  =========================  ===================================================
jobmanager     ``/metrics`` (9250)        it answers: leading, or standing by for the lease
taskmanager    ``/metrics`` (9251)        ``sluice_taskmanager_registered`` is 1 (a leader
                                          acknowledged it)
projector      ``/metrics`` (9252)        it answers
ui             ``/api/taskmanagers``      it answers 200 (so Redis answers it too)
=============  =========================  ===================================================

A process of another command (``sluice status``, Spark's ``spark-class``) has nothing to
check: exit 0, saying so.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import click

__all__ = ["Probe", "probe_for", "verdict", "check", "register", "health"]

METRICS_ROLES = ("jobmanager", "taskmanager", "projector")
ROLES = (*METRICS_ROLES, "ui")
_GROUP_OPTIONS_WITH_VALUES = ("--redis", "--prefix", "--home")  # sluice's own, before the role


@dataclass(frozen=True)
class Probe:
    """What to ask a process of ``role``: ``url``, or ``problem`` when it cannot be asked."""

    role: str | None
    url: str = ""
    problem: str = ""


def _option(args: Sequence[str], name: str) -> str | None:
    """The value of ``--name V`` or ``--name=V`` in ``args`` (the last one given), else None."""
    value = None
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(name + "="):
            value = arg.partition("=")[2]
    return value


def _connect_host(listen: str | None) -> str:
    """Where to reach a server listening on ``listen``: loopback for every interface."""
    if not listen or listen in ("0.0.0.0", "::", "[::]"):
        return "127.0.0.1"
    return f"[{listen}]" if ":" in listen and not listen.startswith("[") else listen


def probe_for(argv: Sequence[str], env: Mapping[str, str]) -> Probe:
    """What to ask the process started as ``argv`` with ``env`` (pure: tested without one)."""
    args = list(argv)
    role, rest = None, []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in _GROUP_OPTIONS_WITH_VALUES:
            i += 2
            continue
        if arg in ROLES:
            role, rest = arg, args[i + 1 :]
            break
        i += 1
    if role is None:
        return Probe(None)
    if role == "ui":
        port = _option(rest, "--port") or "8087"
        host = _option(rest, "--host") or env.get("SLUICE_UI_HOST")
        return _probe(role, port, host, "/api/taskmanagers", "--port")
    variable = f"SLUICE_{role.upper()}_METRICS_PORT"
    port = _option(rest, "--metrics-port") or env.get(variable) or "0"
    host = _option(rest, "--metrics-host") or env.get("SLUICE_METRICS_HOST")
    return _probe(role, port, host, "/metrics", f"--metrics-port (or ${variable})")


def _probe(role: str, port: str, host: str | None, path: str, option: str) -> Probe:
    if not port.isdigit() or not 0 < int(port) < 65536:
        why = "it serves none" if port == "0" else f"{port!r} is not a port"
        return Probe(role, problem=f"no port to ask the {role} on: {why}; start it with {option} PORT")
    return Probe(role, url=f"http://{_connect_host(host)}:{int(port)}{path}")


def verdict(role: str, body: str) -> tuple[bool, str]:
    """Whether a ``role`` process that answered ``body`` is well, and one line saying so."""
    if role == "taskmanager":
        for line in body.splitlines():
            if line.startswith("sluice_taskmanager_registered "):
                if float(line.split()[1]) == 1:
                    return True, "taskmanager: registered with the leader"
                return False, "taskmanager: not registered with a leader (none leads, or Redis is out of reach)"
        return False, "taskmanager: its metrics have no sluice_taskmanager_registered"
    if role == "jobmanager":
        for line in body.splitlines():
            if line.startswith("sluice_jobmanager_leading "):
                leading = float(line.split()[1]) == 1
                return True, "jobmanager: " + ("leading" if leading else "standing by for the lease")
        return False, "jobmanager: its metrics have no sluice_jobmanager_leading"
    return True, f"{role}: answering"


def check(probe: Probe, *, timeout: float = 5.0) -> tuple[bool, str]:
    """Ask the process; (well, one line)."""
    if probe.role is None:
        return True, "not a Sluice service: nothing to check"
    if probe.problem:
        return False, probe.problem
    try:
        with urllib.request.urlopen(probe.url, timeout=timeout) as answer:
            body = answer.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return False, f"{probe.role}: {probe.url} answered {exc.code} {exc.reason}"
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return False, f"{probe.role}: {probe.url} did not answer: {reason}"
    return verdict(probe.role, body)


def _process(pid: int) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of process ``pid`` (ConfigError-free: OSError)."""
    proc = Path("/proc") / str(pid)
    argv = [a.decode(errors="replace") for a in (proc / "cmdline").read_bytes().split(b"\0") if a]
    try:
        raw = (proc / "environ").read_bytes().split(b"\0")
        env = dict(e.decode(errors="replace").partition("=")[::2] for e in raw if b"=" in e)
    except OSError:  # another user's process: this one's environment is the container's too
        env = dict(os.environ)
    return argv, env


@click.command()
@click.option("--pid", default=1, show_default=True, help="The process to check (PID 1: the container's).")
@click.option("--role", type=click.Choice(ROLES), default=None, help="Its role (default: from its command line).")
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="Its port (default: from its command line).")
@click.option("--timeout", default=5.0, show_default=True, help="Seconds to wait for its answer.")
def health(pid: int, role: str | None, port: int | None, timeout: float) -> None:
    """Whether the Sluice process in this container is well (exit 0) or not (exit 1), in
    one line: for a container's HEALTHCHECK. Role and port come from the process's command
    line unless given."""
    sys.exit(run(pid=pid, role=role, port=port, timeout=timeout))


def run(*, pid: int = 1, role: str | None = None, port: int | None = None, timeout: float = 5.0) -> int:
    try:
        argv, env = _process(pid)
    except OSError as exc:
        if role is None:
            click.echo(f"unhealthy: cannot read process {pid}'s command line ({exc}); give --role and --port")
            return 1
        argv, env = [], dict(os.environ)
    if role is not None:
        argv = [role, *(["--port" if role == "ui" else "--metrics-port", str(port)] if port else [])]
    elif port is not None:
        argv = [*argv, "--port", str(port), "--metrics-port", str(port)]
    ok, line = check(probe_for(argv, env), timeout=timeout)
    click.echo(("healthy: " if ok else "unhealthy: ") + line)
    return 0 if ok else 1


def register(cli: click.Group) -> None:
    cli.add_command(health)


if __name__ == "__main__":  # python -m sluice.cli.health: what the image's HEALTHCHECK runs
    sys.exit(run())
