"""A worker waits for its TaskManager's Spark Connect server to listen before it makes a
client (a client made earlier backs off inside gRPC for up to a minute per try)."""

from __future__ import annotations

import socket
import threading

import pytest

from sluice.errors import ConfigError, ServiceError
from sluice.services.embedded.redis_server import free_port
from sluice.services.embedded.spark_connect import wait_listening


def test_returns_once_the_port_listens_and_not_before() -> None:
    port = free_port()
    listening = threading.Event()
    server = socket.socket()

    def listen_later() -> None:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
        server.listen(1)
        listening.set()

    timer = threading.Timer(0.5, listen_later)
    timer.start()
    try:
        wait_listening(f"sc://127.0.0.1:{port}", timeout=30, poll=0.05)
        assert listening.is_set()
    finally:
        timer.cancel()
        server.close()


def test_a_server_that_never_listens_is_named_with_where_to_look() -> None:
    port = free_port()
    with pytest.raises(ServiceError, match=rf"sc://127.0.0.1:{port}/;x=1 did not listen within 0 s; see its log"):
        wait_listening(f"sc://127.0.0.1:{port}/;x=1", timeout=0.3, poll=0.05)


def test_an_address_that_is_not_spark_connect_is_refused() -> None:
    with pytest.raises(ConfigError, match="'http://x:1' is not a Spark Connect address"):
        wait_listening("http://x:1", timeout=1)
