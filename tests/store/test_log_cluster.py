"""The log contract on a Redis Cluster (three masters, three replicas, on loopback), and
what only a cluster does: routing by slot, redirections, reads that span slots."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sluice.store import ClusterBackend, EventLog, Keys
from tests.store.contract import LogContract

pytestmark = pytest.mark.cluster


@pytest.fixture
def cluster_log(redis_cluster: Any, keys: Keys) -> Iterator[EventLog]:
    backend = ClusterBackend(redis_cluster.url)
    yield EventLog(backend, keys)
    for key in backend.scan_keys(keys.pattern):
        backend.delete(key)
    backend.close()


class TestLogOnRedisCluster(LogContract):
    @pytest.fixture
    def log(self, cluster_log: EventLog) -> EventLog:
        return cluster_log
