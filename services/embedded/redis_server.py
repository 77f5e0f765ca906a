"""Spawning a private redis-server: on a free port, with AOF in a data directory."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from sluice.errors import ConfigError, RedisUnavailable
from sluice.store.connection import ping, shutdown

__all__ = ["RedisServer", "find_redis_server", "free_port"]


def find_redis_server() -> str:
    path = shutil.which("redis-server")
    if path is None:
        raise ConfigError(
            "redis-server is not installed: install it (Debian: apt-get install redis-server) "
            "or point Sluice at a running Redis with --redis URL / $SLUICE_REDIS_URL"
        )
    return path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A redis-server child process. ``data_dir`` None keeps nothing on disk; otherwise the
    AOF lives there (``fsync`` 'always' for durability tests, 'everysec' by default)."""

    def __init__(self, data_dir: Path | None = None, *, port: int | None = None, fsync: str = "everysec") -> None:
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self.port = port or free_port()
        self.fsync = fsync
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        cmd = [
            find_redis_server(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--daemonize",
            "no",
            "--protected-mode",
            "yes",
        ]
        if self.data_dir is None:
            cmd += ["--appendonly", "no"]
        else:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            cmd += [
                "--dir",
                str(self.data_dir.resolve()),
                "--appendonly",
                "yes",
                "--appendfsync",
                self.fsync,
                "--logfile",
                "redis.log",
            ]
        return cmd

    def start(self, *, timeout: float = 10.0, detach: bool = False) -> str:
        self.proc = subprocess.Popen(
            self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=detach
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise RedisUnavailable(f"redis-server exited at start (code {self.proc.returncode}): {err.strip()}")
            if ping(self.url):  # false while the AOF is still loading
                return self.url
            time.sleep(0.05)
        self.stop()
        raise RedisUnavailable(f"redis-server on port {self.port} did not answer within {timeout} s")

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def stop(self) -> None:
        stop_server(self.port, self.proc)
        self.proc = None


def stop_server(port: int, proc: subprocess.Popen[bytes] | None = None, pid: int | None = None) -> None:
    """Shut a server down cleanly (the AOF is flushed), killing it if it does not go."""
    shutdown(f"redis://127.0.0.1:{port}/0")
    if proc is not None:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
