"""The log contract against a testcontainers Redis, when asked for and a Docker engine answers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sluice.store import EventLog, Keys, connect
from tests.conftest import docker_redis
from tests.store.contract import LogContract

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def docker_url() -> Iterator[str]:
    """This module's own container (the session's Redis, a container too with
    SLUICE_TEST_DOCKER=1, is the session's to stop)."""
    with docker_redis() as (url, why):
        if url is None:
            pytest.skip(why)
        yield url


class TestLogOnDockerRedis(LogContract):
    @pytest.fixture
    def log(self, docker_url: str, keys: Keys) -> Iterator[EventLog]:
        client = connect(docker_url)
        yield EventLog(client, keys)
        client.close()
