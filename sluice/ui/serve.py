"""Serving the dashboard: the listening socket (bound first, so a port in use is a clear
error, not a uvicorn traceback) and uvicorn on it, in the foreground or in a thread."""

from __future__ import annotations

import errno
import socket
import threading
import time
from types import FrameType

import uvicorn
from starlette.applications import Starlette

from sluice.errors import ConfigError

__all__ = ["bind", "UiServer"]


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: any free one). Raises ConfigError
    naming the address and what to do when it is taken or not ours to bind."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(
            f"--host {host!r} is not an address of this machine ({exc.strerror}); "
            "use 127.0.0.1, 0.0.0.0 or a name that resolves"
        ) from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"port {port} on {host} is in use (another `sluice ui`?): pick a free one with "
                "--port, or --port 0 for any"
            ) from None
        if exc.errno == errno.EACCES:
            raise ConfigError(
                f"not allowed to listen on port {port} of {host} (ports below 1024 need root): pick another with --port"
            ) from None
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}; check --host and --port") from None
    sock.setblocking(False)
    return sock


class _Server(uvicorn.Server):
    """uvicorn that tells the app it is stopping as soon as it is asked to (Ctrl-C, SIGTERM),
    so open event streams end by themselves instead of holding the shutdown up."""

    def __init__(self, config: uvicorn.Config, stopping: threading.Event) -> None:
        super().__init__(config)
        self.stopping = stopping

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.stopping.set()
        super().handle_exit(sig, frame)


class UiServer:
    """uvicorn serving ``app`` on a bound socket. Open event streams end within a second of
    a stop (the app's ``state.stopping`` is set; uvicorn's graceful shutdown is bounded too)."""

    def __init__(self, app: Starlette, sock: socket.socket) -> None:
        self.app, self.sock = app, sock
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=3, lifespan="off", access_log=False)
        self.server = _Server(config, app.state.stopping)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.sock.getsockname()[:2]
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def run(self) -> None:
        """Serve in the foreground until interrupted (Ctrl-C, SIGTERM)."""
        try:
            self.server.run(sockets=[self.sock])
        finally:
            self.app.state.stopping.set()
            self.sock.close()

    def start(self, timeout: float = 10.0) -> str:
        """Serve from a thread; returns the base URL once uvicorn is listening."""
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, name="sluice-ui", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise ConfigError(f"the dashboard did not start on {self.url} within {timeout} s")
            time.sleep(0.01)
        return self.url

    def stop(self) -> None:
        self.app.state.stopping.set()
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.sock.close()
