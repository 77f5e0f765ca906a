"""A master of the log's cluster killed -9 mid-run: its replica is promoted; a call to the
dead master fails as on one Redis (RedisUnavailable: a commit is never sent again blindly,
its reply was lost), the slot map is read again, and a writer that has not seen the
failover is refused on that shard only (StoreRestarted naming the cluster's new server
id), while the other shards accept it. A cluster of its own (the session's stays whole)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.errors import RedisUnavailable, StoreRestarted
from sluice.store import ClusterBackend, EventLog, Keys, Out
from tests.helpers import env, heartbeat
from tools.redis_cluster import LoopbackCluster

pytestmark = pytest.mark.cluster


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[LoopbackCluster]:
    cluster = LoopbackCluster(tmp_path / "cluster")
    cluster.start()
    yield cluster
    cluster.stop()


def test_a_failover_refuses_stale_writers_on_the_failed_shard_only(own_cluster: LoopbackCluster) -> None:
    backend = ClusterBackend(own_cluster.url)
    log = EventLog(backend, Keys("fo"))
    tags = [log.keys.job(f"j{i}") for i in range(12)]
    by_master: dict[str, str] = {}
    for tag in tags:
        by_master.setdefault(backend.node_of(log.keys.facts(tag)), tag)
    hit, spared = list(by_master.values())[:2]
    before = log.server_id()
    for tag in (hit, spared):
        log.commit(tag, 1, [Out(log.keys.facts(tag), env(heartbeat()))], server=before)

    dead = own_cluster.kill_master(log.keys.facts(hit))
    with pytest.raises(RedisUnavailable):  # the reply is lost: not sent again, the caller decides
        log.commit(hit, 1, [Out(log.keys.facts(hit), env(heartbeat()))], server=before)
    own_cluster.wait_stable()  # the replica promoted

    after = log.server_id()
    assert after != before and f"127.0.0.1:{dead}=" not in after
    with pytest.raises(StoreRestarted) as info:  # a writer that has not seen the failover
        log.commit(hit, 1, [Out(log.keys.facts(hit), env(heartbeat()))], server=before)
    assert info.value.run_id == after
    # The other shards did not fail over: what they hold is whole, and the writer goes on there.
    assert not log.commit(spared, 1, [Out(log.keys.facts(spared), env(heartbeat()))], server=before).duplicate
    assert not log.commit(hit, 1, [Out(log.keys.facts(hit), env(heartbeat()))], server=after).duplicate
    assert backend.node_of(log.keys.facts(hit)) != f"127.0.0.1:{dead}"
    backend.close()
