"""The log contract on a Redis Cluster (three masters, three replicas, on loopback), and
what only a cluster does: routing by slot, redirections, reads that span slots."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from sluice.errors import ConfigError, RedisUnavailable, StoreRestarted
from sluice.store import ClusterBackend, EventLog, GroupConsumer, Keys, Out
from tests.helpers import env, heartbeat
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


def _spread(log: EventLog, backend: ClusterBackend, n: int = 12) -> list[str]:
    """Job inboxes of ``n`` jobs: their tags fall on every master of a 3-master cluster."""
    return [log.keys.inbox(log.keys.job(f"j{i}")) for i in range(n)]


def test_each_key_goes_to_the_master_that_serves_its_tags_slot(cluster_log: EventLog, redis_cluster: Any) -> None:
    backend = cluster_log.backend
    assert isinstance(backend, ClusterBackend)
    inboxes = _spread(cluster_log, backend)
    owners = {backend.node_of(s) for s in inboxes}
    assert len(owners) == 3 == len(backend.masters())
    for s in inboxes:
        cluster_log.append(s, env(heartbeat()))
        assert backend.node_of(s) == f"127.0.0.1:{redis_cluster.owner(s)}"
        port = int(backend.node_of(s).rpartition(":")[2])
        assert redis.Redis(host="127.0.0.1", port=port).xlen(s) == 1  # on that node, not elsewhere


def test_a_blocking_read_of_inboxes_on_several_masters_wakes_for_any_and_drops_nothing(cluster_log: EventLog) -> None:
    """The leader blocks on the cluster inbox and every job's inbox (slots on every master):
    an entry in any of them ends the wait; what the other slots' blocked reads got before
    they were unblocked is returned too, never left pending unseen."""
    backend = cluster_log.backend
    assert isinstance(backend, ClusterBackend)
    inboxes = [cluster_log.keys.inbox(cluster_log.keys.cluster), *_spread(cluster_log, backend)]
    consumer = GroupConsumer(cluster_log, inboxes, "jm", "c1", sole=True)
    consumer.ensure_group()
    assert consumer.read(block_ms=None) == []
    late = inboxes[5]
    sent = env(heartbeat())
    timer = threading.Timer(0.2, lambda: cluster_log.append(late, sent))
    timer.start()
    got = consumer.read(block_ms=10_000)
    timer.join()
    assert [(e.stream, e.envelope) for e in got] == [(late, sent)]
    # Entries arriving in many slots at once: all of them come back, over however many reads.
    for s in inboxes:
        cluster_log.append(s, env(heartbeat()))
    seen: list[str] = []
    while len(seen) < len(inboxes):
        batch = consumer.read(block_ms=2000)
        assert batch, "an entry appended was not returned"
        seen += [e.stream for e in batch]
    assert sorted(seen) == sorted(inboxes)
    # What the group holds pending (read, not acknowledged) is exactly what the reads returned.
    pending = [backend.group_state(s, "jm") for s in inboxes]
    assert sum(p.pending for p in pending if p) == len(inboxes) + 1


def test_a_read_of_several_slots_that_times_out_returns_nothing_and_takes_nothing(cluster_log: EventLog) -> None:
    backend = cluster_log.backend
    inboxes = _spread(cluster_log, backend, 4)  # type: ignore[arg-type]
    for s in inboxes:
        backend.group_create(s, "g", "$")
    assert backend.xreadgroup("g", "c", {s: ">" for s in inboxes}, count=10, block_ms=50) == []
    assert backend.xread({s: "$" for s in inboxes}, count=10, block_ms=50) == []
    assert all(backend.group_state(s, "g").pending == 0 for s in inboxes)  # type: ignore[union-attr]


def test_a_stale_slot_map_is_corrected_by_moved_and_the_call_goes_through(cluster_log: EventLog) -> None:
    """A call sent to a master that no longer serves the slot (after a failover or a
    resharding) is answered MOVED without running: it goes again to the right master (a
    commit too), and the map is read again."""
    backend = cluster_log.backend
    assert isinstance(backend, ClusterBackend)
    tag = cluster_log.keys.job("moved")
    facts = cluster_log.keys.facts(tag)
    right = backend.node_of(facts)
    wrong = next(m for m in backend.masters() if m != right)
    slot = key_slot(facts.encode())
    server = cluster_log.server_id()
    backend._slots[slot] = wrong
    before = backend.redirections
    result = cluster_log.commit(tag, 1, [Out(facts, env(heartbeat()))], server=server)
    assert not result.duplicate and cluster_log.length(facts) == 1
    assert backend.redirections == before + 1 and backend.node_of(facts) == right
    backend._slots[slot] = wrong  # a read and a batch of scripts follow it the same way
    assert cluster_log.length(facts) == 1
    backend._slots[slot] = wrong
    assert backend.script_many([("advance_cursor", [cluster_log.keys.outbox_cursor(tag)], ["", "1-0"])]) == [b"1-0"]
    backend._slots[slot] = wrong
    consumer = GroupConsumer(cluster_log, [facts, cluster_log.keys.inbox(cluster_log.keys.cluster)], "g", "c")
    assert len(consumer.read(block_ms=None)) == 1


def test_a_slot_in_migration_is_served_after_ask(cluster_log: EventLog, redis_cluster: Any) -> None:
    """While a slot moves between masters, the old one answers ASK for a key it no longer
    holds: the call goes once to the new one, after ASKING. Then the slot is handed over."""
    backend = cluster_log.backend
    assert isinstance(backend, ClusterBackend)
    tag = cluster_log.keys.job("asked")
    inbox = cluster_log.keys.inbox(tag)
    slot = key_slot(inbox.encode())
    source = backend.node_of(inbox)
    target = next(m for m in backend.masters() if m != source)
    src, dst = (redis.Redis(host="127.0.0.1", port=int(a.rpartition(":")[2])) for a in (source, target))
    src_id, dst_id = src.execute_command("CLUSTER MYID"), dst.execute_command("CLUSTER MYID")
    dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)
    src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)
    try:
        before = backend.redirections
        entry = cluster_log.append(inbox, env(heartbeat()))  # not on the source: ASK, then the target
        assert backend.redirections > before
        assert [c.execute_command("CLUSTER COUNTKEYSINSLOT", slot) for c in (src, dst)] == [0, 1]
        assert [i for i, _ in cluster_log.read_page(inbox)] == [entry]
    finally:
        for node in redis_cluster.alive():
            c = redis.Redis(host="127.0.0.1", port=node.port)
            try:
                c.execute_command("CLUSTER SETSLOT", slot, "NODE", dst_id)
            except redis.ResponseError:
                pass  # (a replica: it learns it from its master)
        redis_cluster.wait_stable()
    backend.refresh()
    assert backend.node_of(inbox) == target and cluster_log.length(inbox) == 1


def test_the_server_id_names_every_masters_run_id_and_a_script_is_checked_against_its_own(
    cluster_log: EventLog,
) -> None:
    backend = cluster_log.backend
    assert isinstance(backend, ClusterBackend)
    server = cluster_log.server_id()
    assert server.startswith("cluster:") and server.count("=") == 3
    for addr in backend.masters():
        assert f"{addr}={backend.node(addr).server_id()}" in server
    tag = cluster_log.keys.job("x")
    facts = cluster_log.keys.facts(tag)
    assert not cluster_log.commit(tag, 1, [Out(facts, env(heartbeat()))], server=server).duplicate
    other = server.replace(server.split("=")[1][:40], "0" * 40)  # a master restarted since
    stale = ",".join(
        p.replace(p.split("=")[1], "0" * 40) if p.startswith(backend.node_of(facts)) else p
        for p in server.removeprefix("cluster:").split(",")
    )
    with pytest.raises(StoreRestarted) as info:
        cluster_log.commit(tag, 1, [Out(facts, env(heartbeat()))], server="cluster:" + stale)
    assert info.value.run_id == server
    assert other  # (another master's restart does not refuse this tag's commit)


def test_a_cluster_url_on_a_single_redis_is_refused_with_what_to_use(redis_url: str) -> None:
    port = redis_url.rsplit(":", 1)[1].split("/")[0]
    with pytest.raises(ConfigError, match=r"without cluster mode; use redis://127.0.0.1:\d+"):
        ClusterBackend(f"redis+cluster://127.0.0.1:{port}")


def test_a_cluster_no_seed_of_which_answers_is_unavailable_naming_each() -> None:
    with pytest.raises(RedisUnavailable, match="no node of the Redis Cluster .* answers: 127.0.0.1:1 .*127.0.0.1:2"):
        ClusterBackend("redis+cluster://127.0.0.1:1,127.0.0.1:2", timeout=0.5)
