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
from sluice.store.cluster_backend import is_cluster_server_id, server_masters
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
    assert is_cluster_server_id(server) and server.count("=") == 3
    named = server_masters(server)
    for addr in backend.masters():  # each master's run id and replication id
        replid = backend.node(addr).client.info("replication")["master_replid"]
        assert named[addr] == f"{backend.node(addr).server_id()}:{replid}"
    assert not backend.durable()  # a promoted replica may miss acknowledged writes
    tag = cluster_log.keys.job("x")
    facts = cluster_log.keys.facts(tag)
    assert not cluster_log.commit(tag, 1, [Out(facts, env(heartbeat()))], server=server).duplicate
    mine = backend.node_of(facts)

    def restarted(which: str) -> str:
        """``server`` with the run id of the master ``which`` changed (a restart or failover since)."""
        parts = [
            p.replace(p.split("=")[1], "0" * 40) if p.startswith(which + "@") else p for p in server[9:].split(",")
        ]
        return "c0000000:" + ",".join(parts)

    with pytest.raises(StoreRestarted) as info:  # this tag's master is not the one the writer saw
        cluster_log.commit(tag, 1, [Out(facts, env(heartbeat()))], server=restarted(mine))
    assert info.value.run_id == server
    other = next(m for m in backend.masters() if m != mine)  # another shard's: this tag's commits go on
    assert not cluster_log.commit(tag, 1, [Out(facts, env(heartbeat()))], server=restarted(other)).duplicate


def test_a_cluster_url_on_a_single_redis_is_refused_with_what_to_use(redis_url: str) -> None:
    port = redis_url.rsplit(":", 1)[1].split("/")[0]
    with pytest.raises(ConfigError, match=r"without cluster mode; use redis://127.0.0.1:\d+"):
        ClusterBackend(f"redis+cluster://127.0.0.1:{port}")


def test_a_cluster_no_seed_of_which_answers_is_unavailable_naming_each() -> None:
    with pytest.raises(RedisUnavailable, match="no node of the Redis Cluster .* answers: 127.0.0.1:1 .*127.0.0.1:2"):
        ClusterBackend("redis+cluster://127.0.0.1:1,127.0.0.1:2", timeout=0.5)


def test_inspection_and_metrics_read_streams_on_every_master(cluster_log: EventLog) -> None:
    """``sluice inspect``, ``stats`` and the metrics endpoints read many streams at once: one
    pipeline per master, each stream's commands on the master serving it."""
    from sluice.store import inspection, metrics_reads

    backend = cluster_log.backend
    assert isinstance(backend, ClusterBackend)
    keys = cluster_log.keys
    inboxes = _spread(cluster_log, backend)
    assert len({backend.node_of(s) for s in inboxes}) == 3
    for n, s in enumerate(inboxes):
        for _ in range(n % 3 + 1):
            cluster_log.append(s, env(heartbeat()))
    consumer = GroupConsumer(cluster_log, inboxes, "jm", "c1")
    consumer.ensure_group()
    read = consumer.read(count=1, block_ms=None)
    assert len(read) == len(inboxes)

    sizes = inspection.stream_summaries(cluster_log, inboxes)
    assert [sizes[s][0] for s in inboxes] == [n % 3 + 1 for n in range(len(inboxes))]
    assert all(sizes[s][2] == backend.last_id(s) for s in inboxes)
    groups = inspection.consumer_groups(cluster_log, inboxes)
    assert sorted((g.stream, g.pending, g.oldest_pending) for g in groups) == sorted((e.stream, 1, e.id) for e in read)
    readings = metrics_reads.inbox_readings(cluster_log, inboxes, "jm")
    assert {(r.stream, r.lag, r.pending) for r in readings} == {(s, n % 3, 1) for n, s in enumerate(inboxes)}
    dead = keys.dead(keys.job("j4"))
    cluster_log.append_raw(dead, {b"stream": inboxes[4].encode(), b"entry": b"1-0", b"field:e": b"x"})
    tags = [keys.job(f"j{i}") for i in range(len(inboxes))]
    assert metrics_reads.dead_letter_counts(cluster_log, tags) == {t: int(t == keys.job("j4")) for t in tags}
    newest, last = inspection.newest(cluster_log, inboxes, None, 5)
    assert len(newest) == 5 and all(last[s] == backend.last_id(s) for s in inboxes)
    everything = sorted(((s, i) for s in inboxes for i, _ in cluster_log.replay_raw(s)), key=lambda x: x[1])
    assert [(s, i) for s, i, _ in newest] == everything[-5:] or len({i for _, i in everything}) < len(everything)
    assert [i for i, _ in inspection.entries_before(cluster_log, inboxes[7], None, 10)] == [
        i for i, _ in reversed(list(cluster_log.replay_raw(inboxes[7])))
    ]
    first = read[0]
    assert inspection.entry(cluster_log, first.stream, first.id) is not None
    assert inspection.count_after(cluster_log, inboxes[2], "0-0") == 3
    memory, size, ours, used = inspection.server_footprint(cluster_log)
    assert ours >= len(inboxes) + 1 and size >= ours and memory > used > 0
    again = inspection.redrive_entry(cluster_log, dead, cluster_log.last_id(dead) or "", inboxes[4], {b"e": b"x"})
    assert again is not None and cluster_log.length(dead) == 0 and cluster_log.last_id(inboxes[4]) == again


def test_appends_to_many_tags_go_per_master_in_one_round_trip_each_past_a_moved_slot(
    cluster_log: EventLog,
) -> None:
    """The leader's heartbeat to every TaskManager: one transaction per tag, each master's in
    one round trip; a slot the map placed wrongly follows MOVED; a key that is not a stream
    refuses only its own (PartlyAppended), the others are in, in order."""
    from sluice.errors import PartlyAppended

    backend = cluster_log.backend
    assert isinstance(backend, ClusterBackend)
    keys = cluster_log.keys
    inboxes = [keys.inbox(keys.taskmanager(f"tm-{i}")) for i in range(9)]
    right = backend.node_of(inboxes[0])
    backend._slots[key_slot(inboxes[0].encode())] = next(m for m in backend.masters() if m != right)
    backend.set(inboxes[5], b"not a stream")
    items = [(s, {b"e": f"{s}-{n}".encode()}) for s in inboxes for n in range(2)]
    with pytest.raises(PartlyAppended) as info:
        backend.xadd_many(items)
    assert set(info.value.errors) == {10, 11}
    for n, s in enumerate(inboxes):
        if n != 5:
            assert [f[b"e"] for _, f in backend.xrange(s, None, 10)] == [f"{s}-0".encode(), f"{s}-1".encode()]
            assert [i for i, _ in backend.xrange(s, None, 10)] == info.value.ids[2 * n : 2 * n + 2]
    assert backend.node_of(inboxes[0]) == right
    backend.delete(inboxes[5])
    assert len(backend.xadd_many(items)) == len(items)


def test_following_streams_on_several_masters_wakes_for_any(cluster_log: EventLog) -> None:
    """The projector and ``inspect tail`` follow streams of many tags (XREAD BLOCK): on a
    cluster, each slot's streams block at once and the first entry ends the wait."""
    backend = cluster_log.backend
    assert isinstance(backend, ClusterBackend)
    streams = [cluster_log.keys.facts(cluster_log.keys.job(f"j{i}")) for i in range(12)]
    assert len({backend.node_of(s) for s in streams}) == 3
    positions = {s: "0-0" for s in streams}
    assert cluster_log.follow(positions, block_ms=50) == []
    sent = env(heartbeat())
    timer = threading.Timer(0.2, lambda: cluster_log.append(streams[7], sent))
    timer.start()
    ((stream, _, fields),) = cluster_log.follow(positions, block_ms=10_000)
    timer.join()
    assert stream == streams[7] and cluster_log.decode(fields[b"e"]) == sent


def test_a_slots_queue_lives_on_its_own_redis_and_a_tasks_reports_reach_the_log_first(
    cluster_log: EventLog, redis_url: str, prefix: str
) -> None:
    """RQ is not cluster-safe: its queues live on a single Redis. A task's reports go to
    the log (the cluster) before its job is queued there; one refused queues nothing."""
    from rq import Queue

    from sluice.errors import PartlyAppended
    from sluice.store import connect
    from sluice.store.slots import SlotQueues
    from tests.conftest import RQ_PREFIX

    cluster_log = EventLog(cluster_log.backend, Keys(RQ_PREFIX))  # RQ's keys: this process's one prefix
    rq = connect(redis_url)
    queues = SlotQueues(cluster_log, "tm-1", rq=rq)
    inbox = cluster_log.keys.inbox(cluster_log.keys.job("j1"))
    reports = [(inbox, env(heartbeat(rid="first"))), (inbox, env(heartbeat(rid="second")))]
    assert queues.enqueue(0, "tools.bench.tasks.noop", ({}, {}), job_id=prefix + "h1", description="t", before=reports)
    assert [e for _, e in cluster_log.replay(inbox)] == [e for _, e in reports]
    queue = Queue(cluster_log.keys.slot_queue("tm-1", 0), connection=rq)
    assert queue.job_ids == [prefix + "h1"] and queues.exists(prefix + "h1")
    facts = cluster_log.keys.facts(cluster_log.keys.job("j2"))  # not an inbox: not set aside, refused
    cluster_log.backend.set(facts, b"not a stream")
    with pytest.raises(PartlyAppended):
        queues.enqueue(
            0,
            "tools.bench.tasks.noop",
            ({}, {}),
            job_id=prefix + "h2",
            description="t",
            before=[(facts, env(heartbeat()))],
        )
    assert queue.job_ids == [prefix + "h1"] and not queues.exists(prefix + "h2")
    queue.delete(delete_jobs=True)
    rq.close()


def test_following_a_key_that_is_not_a_stream_among_many_fails_as_on_one_redis(cluster_log: EventLog) -> None:
    """One key of many that holds another kind of value fails the whole read (WrongType),
    as it does on one Redis, though the other slots answered (XREAD takes nothing)."""
    from sluice.errors import WrongType

    streams = [cluster_log.keys.facts(cluster_log.keys.job(f"j{i}")) for i in range(12)]
    for s in streams:
        cluster_log.append(s, env(heartbeat()))
    cluster_log.backend.delete(streams[3])
    cluster_log.backend.set(streams[3], b"x")
    with pytest.raises(WrongType):
        cluster_log.follow({s: "0-0" for s in streams}, block_ms=None)
