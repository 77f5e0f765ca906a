"""The log contract against a testcontainers Redis, when asked for and a Docker engine answers."""

from __future__ import annotations

from typing import Iterator

import pytest

from sluice.store import EventLog, Keys, connect
from tests.conftest import docker_redis_url
from tests.store.contract import LogContract

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def docker_url() -> Iterator[str]:
    url, why = docker_redis_url()
    if url is None:
        pytest.skip(why)
    yield url
    from tests.conftest import _containers

    while _containers:
        _containers.pop().stop()


class TestLogOnDockerRedis(LogContract):
    @pytest.fixture
    def log(self, docker_url: str, keys: Keys) -> Iterator[EventLog]:
        client = connect(docker_url)
        yield EventLog(client, keys)
        client.close()
