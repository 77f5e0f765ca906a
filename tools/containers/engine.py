"""The Docker engine and the local images, through the two scripts CI uses too:
``scripts/docker-engine`` (install and start an engine, or reuse the one running) and
``scripts/docker-images`` (the base image and the stand-ins ``python:3.11-slim`` and
``redis:7``, from Debian's packages)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence

from tools import ROOT

__all__ = ["ENGINE_SOCKET", "docker_host", "start_engine", "build_images", "compose_command", "docker_env"]

ENGINE_DIR = os.environ.get("SLUICE_DOCKER_DIR", "/var/lib/sluice-docker")
ENGINE_SOCKET = f"{ENGINE_DIR}/docker.sock"
"""The socket of the engine scripts/docker-engine starts."""


def docker_host(env: Mapping[str, str] | None = None) -> str | None:
    """The engine to talk to: ``$DOCKER_HOST``, else the one scripts/docker-engine started (when
    its socket is there), else None (Docker's default socket)."""
    env = os.environ if env is None else env
    if env.get("DOCKER_HOST"):
        return env["DOCKER_HOST"]
    return f"unix://{ENGINE_SOCKET}" if os.path.exists(ENGINE_SOCKET) else None


def docker_env(host: str | None = None) -> dict[str, str]:
    """This process's environment with ``DOCKER_HOST`` set to ``host`` (default: docker_host())."""
    env = dict(os.environ)
    host = host or docker_host()
    if host:
        env["DOCKER_HOST"] = host
    return env


def start_engine(timeout: float = 600.0) -> tuple[str | None, str]:
    """(DOCKER_HOST, '') of a running engine (started, and installed, when needed), or
    (None, why not) in one line."""
    try:
        done = subprocess.run(
            [str(ROOT / "scripts" / "docker-engine")], capture_output=True, text=True, timeout=timeout
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"scripts/docker-engine did not run: {exc}"
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return None, lines[-1] if lines else f"scripts/docker-engine exited {done.returncode}"
    host = done.stdout.strip().partition("=")[2]
    return host, ""


def build_images(names: Sequence[str], host: str, timeout: float = 1200.0) -> None:
    """The base image and the stand-ins ``names`` (``python``, ``redis``); kept when there."""
    subprocess.run([str(ROOT / "scripts" / "docker-images"), *names], env=docker_env(host), check=True, timeout=timeout)


def compose_command(choice: str | None = None) -> list[str]:
    """How to call Compose: ``docker compose`` (v2) where the plugin is there, else Debian's
    ``docker-compose`` (v1); ``choice`` (``v1``/``v2``, or $SLUICE_COMPOSE) forces one."""
    choice = choice or os.environ.get("SLUICE_COMPOSE") or ""
    v2 = ["docker", "compose"]
    if choice != "v1" and shutil.which("docker"):
        has_v2 = subprocess.run([*v2, "version"], capture_output=True).returncode == 0
        if has_v2 or choice == "v2":
            return v2
    if shutil.which("docker-compose") is None:
        raise RuntimeError("no Compose: neither `docker compose` (v2) nor docker-compose (v1) is installed")
    return ["docker-compose"]
