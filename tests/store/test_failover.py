"""A failover is a restart of a shard's log: the scripts' restart check (store/scripts.py) sees
it by the node's run id and replication id (store/shards.py), on a real master and replica
and on the in-memory store's shards."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

from sluice.errors import RedisUnavailable, StoreRestarted
from sluice.events import Envelope, TaskManagerRegistered
from sluice.services.embedded.redis_server import RedisServer
from sluice.store import shards
from sluice.store.backend import ScriptFailed
from sluice.store.connection import connect
from sluice.store.keys import Keys
from sluice.store.log import Consumed, EventLog, Out
from sluice.store.memory import MemoryBackend, MemoryStore
from sluice.store.wait import Wait


@given(st.binary(max_size=40))
def test_keyslot_is_redis_clusters(key: bytes) -> None:
    assert shards.keyslot(key) == key_slot(key)


def test_slot_ranges_are_redis_clis() -> None:
    assert shards.slot_ranges(3) == [(0, 5460), (5461, 10922), (10923, 16383)]
    assert shards.slot_ranges(1) == [(0, 16383)]
    assert [shards.shard_of_slot(s, 3) for s in (0, 5460, 5461, 10922, 10923, 16383)] == [0, 0, 1, 1, 2, 2]
    with pytest.raises(ValueError, match="at least one master"):
        shards.slot_ranges(0)


@pytest.fixture
def pair() -> Iterator[tuple[redis.Redis, redis.Redis]]:
    """A master and its replica (two private redis-servers)."""
    master, replica = RedisServer(None), RedisServer(None)
    m, r = connect(master.start()), connect(replica.start())
    try:
        m.config_set("repl-diskless-sync-delay", 0)  # (5 s by default: the first sync waits for more replicas)
        r.execute_command("REPLICAOF", "127.0.0.1", master.port)
        deadline = time.monotonic() + 30
        while not (
            r.info("replication").get("master_link_status") == "up"
            and m.info("replication").get("slave0", {}).get("state") == "online"
        ):
            assert time.monotonic() < deadline, "the replica did not come in sync with its master within 30 s"
            time.sleep(0.02)
        yield m, r
    finally:
        m.close(), r.close()
        master.stop(), replica.stop()


def _identity(client: redis.Redis) -> str:
    return shards.identity(client.info("server")["run_id"], client.info("replication")["master_replid"])


def test_a_promoted_replica_is_another_server(pair: tuple[redis.Redis, redis.Redis]) -> None:
    """A replica keeps its own run id, and promotion starts a new replication id: a writer that
    saw the master is refused by the promoted replica, whichever it named."""
    m, r = pair
    keys = Keys("fo")
    tag = keys.cluster
    before = _identity(m)
    mlog = EventLog(m, keys)
    assert mlog.fence(tag, 1, server=before) == 1
    assert mlog.fence(tag, 1, server=m.info("server")["run_id"]) == 1
    assert mlog.fence(tag, 1, server=shards.joined([before, "0" * 40 + ":" + "1" * 40])) == 1
    r.execute_command("REPLICAOF", "NO", "ONE")  # what a failover does to the replica
    after = _identity(r)
    assert after.split(":")[0] != before.split(":")[0] and after.split(":")[1] != before.split(":")[1]
    rlog = EventLog(r, keys)
    for seen in (before, before.split(":")[0]):
        with pytest.raises(StoreRestarted) as info:
            rlog.fence(tag, 2, server=seen)
        assert info.value.run_id == (after if ":" in seen else after.split(":")[0])
    assert rlog.fence(tag, 2, server=shards.joined([before, after])) == 2


def test_a_bad_replication_id_is_refused(log: EventLog) -> None:
    run = log.server_id()
    me = _identity(log.backend.client)  # type: ignore[attr-defined]
    tag = log.keys.cluster
    with pytest.raises(StoreRestarted):
        log.fence(tag, 1, server=shards.identity(run, "0" * 40))
    assert log.fence(tag, 1, server=me) == 1


def test_memory_shards_fail_over_one_at_a_time() -> None:
    """Each shard of the in-memory store fails over alone, losing its own last writes."""
    now = [1000]
    store = MemoryStore(lambda: now[0], shards=3)
    keys = Keys("fo")
    tags = {store.shard_of(keys.job(f"j{i}")): keys.job(f"j{i}") for i in range(40)}
    assert sorted(tags) == [0, 1, 2] and store.shard_of(keys.cluster) in tags
    b = MemoryBackend(store)
    seen = b.server_id()
    named = shards.masters_of(seen)
    assert named is not None and [ident for _, _, ident in named] == [store.identity(i) for i in range(3)]
    assert [ranges for _, ranges, _ in named] == [[r] for r in shards.slot_ranges(3)]
    for tag in tags.values():
        b.set(tag + ":x", b"early")
    now[0] = 3000
    for tag in tags.values():
        b.set(tag + ":x", b"late")
    store.failover(1, lose_after_ms=2000)
    with pytest.raises(RedisUnavailable, match="reset"):
        b.get(tags[0] + ":x")
    assert [b.get(tags[i] + ":x") for i in range(3)] == [b"late", b"early", b"late"]
    assert store.failovers == [0, 1, 0] and b.server_id() != seen
    assert shards.failed_slots(seen, b.server_id()) == [shards.slot_ranges(3)[1]]  # that shard's slots alone
    fences = {i: keys.fence(tags[i]) for i in range(3)}
    assert b.script("fence", [fences[0]], [1, seen]) == 1  # shard 0 is the one the writer saw
    with pytest.raises(ScriptFailed, match="^SLUICE_RESTARTED " + store.identity(1)):
        b.script("fence", [fences[1]], [1, seen])
    with pytest.raises(ValueError, match="no shard 3"):
        store.failover(3)
    with pytest.raises(ValueError, match="at least one shard"):
        MemoryStore(lambda: 0, shards=0)


def test_the_slots_that_failed_over_are_told_from_two_server_ids() -> None:
    """A promoted replica (a new identity) serves the dead master's slots: those failed over.
    A master that only took slots over (a resharding) kept its writes; an id without slot
    ranges (one Redis, or an older cluster id) tells nothing: everything may be lost."""
    a, b, c, d = (shards.identity(x * 8, y * 40) for x, y in (("a", "1"), ("b", "2"), ("c", "3"), ("d", "4")))
    before = "c0000000:" + ",".join(
        [shards.master_part("h:1", [(0, 99)], a), shards.master_part("h:2", [(100, 16383)], b)]
    )
    promoted = "c1111111:" + ",".join(
        [shards.master_part("h:3", [(0, 99)], c), shards.master_part("h:2", [(100, 16383)], b)]
    )
    resharded = ",".join([shards.master_part("h:1", [(0, 50)], a), shards.master_part("h:2", [(51, 16383)], b)])
    assert shards.failed_slots(before, promoted) == [(0, 99)]
    assert shards.failed_slots(before, resharded) == [] and shards.failed_slots(before, before) == []
    assert shards.failed_slots("ab" * 20, "cd" * 20) is None
    assert shards.failed_slots(before, "c2222222:h:1=" + d) is None  # no slot ranges named
    assert shards.in_slots(50, [(0, 99)]) and not shards.in_slots(100, [(0, 99)]) and shards.in_slots(7, None)
    assert shards.matches(promoted, "c" * 8, "3" * 40) and not shards.matches(promoted, "a" * 8, "9" * 40)


def test_one_shard_is_one_redis() -> None:
    store = MemoryStore(lambda: 0)
    b = MemoryBackend(store)
    assert b.server_id() == store.run_id and store.shard_of("{a}x") == 0
    store.failover(0)
    with pytest.raises(RedisUnavailable, match="reset"):
        b.get("{a}x")
    assert b.script("fence", [Keys("fo").fence("{fo:cluster}")], [1, ""]) == 1
    with pytest.raises(ScriptFailed, match="^SLUICE_RESTARTED " + store.run_id + "$"):
        b.script("fence", [Keys("fo").fence("{fo:cluster}")], [1, "ab"])


# --- WAIT: a commit acknowledged once replicas have it (store/wait.py) ----------------------


def _commit(log: EventLog, n: int) -> None:
    tag = log.keys.cluster
    ev = Envelope(TaskManagerRegistered(f"tm{n}", "s", "h", 1, {}), f"{n:032x}", 1, 0, None, None)
    log.commit(tag, 1, [Out(log.keys.facts(tag), ev)])


def test_a_waiting_commit_is_on_the_replica_when_acknowledged(pair: tuple[redis.Redis, redis.Redis]) -> None:
    m, r = pair
    log = EventLog(m, Keys("fo"))
    log.wait = Wait(replicas=1, timeout_ms=5000)
    for n in range(20):
        _commit(log, n)
        assert r.xlen(log.keys.facts(log.keys.cluster)) == n + 1  # (WAIT returned: the replica has it)
    m.script_flush()  # a master that lost its scripts: EVAL, and the wait all the same
    _commit(log, 20)
    assert r.xlen(log.keys.facts(log.keys.cluster)) == 21


def test_too_few_replicas_is_an_unknown_outcome(pair: tuple[redis.Redis, redis.Redis]) -> None:
    m, _ = pair
    log = EventLog(m, Keys("fo"))
    # (a timeout a loaded machine's replica answers WAIT's GETACK in: the one replica counts)
    log.wait = Wait(replicas=2, timeout_ms=500)
    with pytest.raises(RedisUnavailable, match=r"reached 1 of the 2 replicas asked for within 500 ms"):
        _commit(log, 0)
    log.wait = Wait(replicas=1, timeout_ms=20)
    with pytest.raises(StoreRestarted):  # a script's refusal is raised as without WAIT
        log.commit(log.keys.cluster, 2, [], Consumed(log.keys.inbox(log.keys.cluster), "g", ("1-0",)), server="0" * 40)


def test_wait_settings_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice.config import load
    from sluice.errors import ConfigError

    with pytest.raises(ConfigError, match="SLUICE_REDIS_WAIT_REPLICAS=-1"):
        Wait(replicas=-1)
    with pytest.raises(ConfigError, match="SLUICE_REDIS_WAIT_TIMEOUT_MS=0"):
        Wait(replicas=1, timeout_ms=0)
    monkeypatch.delenv("SLUICE_REDIS_WAIT_REPLICAS", raising=False)
    assert load().redis_wait_replicas == 0
    monkeypatch.setenv("SLUICE_REDIS_WAIT_REPLICAS", "2")
    assert load().redis_wait_replicas == 2
    monkeypatch.setenv("SLUICE_REDIS_WAIT_REPLICAS", "two")
    with pytest.raises(ConfigError, match=r"SLUICE_REDIS_WAIT_REPLICAS='two' is not allowed: give a whole number"):
        load()
    monkeypatch.setenv("SLUICE_REDIS_WAIT_REPLICAS", "-3")
    with pytest.raises(ConfigError, match="'-3' is not allowed: give a whole number of replicas, 0 or more"):
        load()


def test_the_memory_store_has_every_write_on_its_replicas() -> None:
    log = EventLog(MemoryBackend(MemoryStore(lambda: 5)), Keys("fo"))
    log.wait = Wait(replicas=2)
    _commit(log, 0)
    assert log.backend.xlen(log.keys.facts(log.keys.cluster)) == 1


@pytest.mark.cluster
def test_a_waiting_commit_on_a_cluster_is_on_its_masters_replica(redis_cluster: Any, keys: Keys) -> None:
    """On a Redis Cluster, the commit and its WAIT run on the master serving the tag."""
    from sluice.store import ClusterBackend
    from tools.bench.wait import replicas_in_sync

    replicas_in_sync(redis_cluster)
    backend = ClusterBackend(redis_cluster.url)
    log = EventLog(backend, keys)
    log.wait = Wait(replicas=1, timeout_ms=5000)
    try:
        for job in ("a", "b", "c", "d"):
            tag = keys.job(job)
            ev = Envelope(TaskManagerRegistered("tm", "s", "h", 1, {}), f"{ord(job):032x}", 1, 0, None, None)
            log.commit(tag, 1, [Out(keys.facts(tag), ev)], server=log.server_id())
            master = redis.Redis(host="127.0.0.1", port=redis_cluster.owner(tag))
            replica = next(
                redis.Redis(host="127.0.0.1", port=n.port)
                for n in redis_cluster.alive()
                if redis.Redis(host="127.0.0.1", port=n.port).info("replication").get("master_port")
                == master.connection_pool.connection_kwargs["port"]
            )
            replica.execute_command("READONLY")
            assert replica.xlen(keys.facts(tag)) == 1  # (WAIT returned: the replica has it)
        log.wait = Wait(replicas=2, timeout_ms=500)  # (the one replica acks within it, even under load)
        with pytest.raises(RedisUnavailable, match="reached 1 of the 2 replicas"):
            log.commit(keys.job("a"), 1, [Out(keys.facts(keys.job("a")), ev)])
    finally:
        for key in backend.scan_keys(keys.pattern):
            backend.delete(key)
        backend.close()
