"""Sluice in containers, with real parts (issue 33): a Docker engine of our own, images built
from Debian's packages (no registry), and ``scripts/compose-check``, which runs compose.yaml
for real with faults (``compose_check.py``; docs/containers.md).

``engine.py`` wraps the two scripts CI shares: ``scripts/docker-engine`` (install and start an
engine, or reuse the one running: ``start_engine()``) and ``scripts/docker-images`` (the base
image and the stand-ins ``python:3.11-slim`` and ``redis:7``: ``build_images()``).
"""

from __future__ import annotations

from .engine import ENGINE_SOCKET, build_images, compose_command, docker_env, docker_host, start_engine

__all__ = ["ENGINE_SOCKET", "build_images", "compose_command", "docker_env", "docker_host", "start_engine"]
