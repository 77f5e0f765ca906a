"""The in-memory store's own features, the ones the simulation injects faults with: lost
writes at a restart (the AOF), connections reset by a restart, a store that is down, and
determinism. Its Redis semantics are tested by the log contract (test_log_memory.py) and
against a real Redis, call by call (test_twin_vs_redis.py)."""

from __future__ import annotations

import random

import pytest

from sluice.errors import RedisUnavailable, StoreRestarted
from sluice.store import Consumed, Deliverer, EventLog, GroupConsumer, Keys, LeaderLease, Out
from sluice.store.backend import Delegating, ScriptFailed
from sluice.store.memory import MemoryBackend, MemoryStore, PendingEntry
from tests.helpers import env, heartbeat
from tests.store.contract import registered


class Clock:
    """A simulated clock: it moves only when told."""

    def __init__(self, now: int = 1_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(clock: Clock) -> MemoryStore:
    return MemoryStore(clock, seed=7)


def log_on(store: MemoryStore, name: str = "p") -> EventLog:
    return EventLog(MemoryBackend(store, name), Keys("t"))


def workload(log: EventLog, clock: Clock) -> None:
    """Some of every kind of write: entries, a group with pending and acknowledged entries,
    a commit that raises a fence, a table, the lease (a TTL and the epoch counter), a
    delivery and its mark, a trim."""
    k = log.keys
    tag = k.cluster
    inbox, facts = k.inbox(tag), k.facts(tag)
    epoch = LeaderLease(log, f"leader{clock.now}", 300).try_acquire()
    assert epoch is not None
    log.append_batch(inbox, [env(heartbeat(rid=f"tm-{i}")) for i in range(4)])
    c = GroupConsumer(log, inbox, "jm", "c1")
    first, *_ = c.read(count=3, block_ms=None)
    log.commit(tag, epoch, [Out(facts, env(registered(f"r{clock.now}")))], Consumed(inbox, "jm", first.id))
    log.backend.hset(k.table(tag, "t"), {f"row{clock.now}": b"1"})
    target = k.inbox(k.taskmanager("tm-1"))
    log.commit(tag, epoch, [Out(k.outbox(tag), env(heartbeat()), to=target)])
    Deliverer(log, tag).deliver()
    log.trim_before(inbox, first.id)


# --- lost writes -------------------------------------------------------------------------------


def test_a_restart_that_loses_nothing_keeps_everything_and_changes_the_run_id(store: MemoryStore, clock: Clock) -> None:
    log = log_on(store)
    workload(log, clock)
    before, run_id = store.dump(), store.run_id
    store.crash()
    assert store.dump() == before
    assert store.run_id != run_id and len(store.run_id) == 40 and int(store.run_id, 16) >= 0
    assert store.generation == 1
    # Rebuilding from the whole AOF gives the same state too.
    store.crash(lose_after_ms=clock.now)
    assert store.dump() == before and store.generation == 2


def test_a_restart_loses_exactly_the_writes_after_the_given_time(store: MemoryStore, clock: Clock) -> None:
    log = log_on(store)
    k = log.keys
    workload(log, clock)
    at_1000 = store.dump()
    pending_at_1000 = store.pending(k.inbox(k.cluster), "jm")
    clock.now = 2_000  # the lease (300 ms) has expired: another leader takes over at epoch 2
    workload(log, clock)
    GroupConsumer(log, k.inbox(k.cluster), "jm", "c1").ack(*(p.id for p in pending_at_1000))
    assert log.backend.get(k.epoch) == b"2" and store.dump() != at_1000
    store.crash(lose_after_ms=1_999)
    assert store.dump() == at_1000
    log = log_on(store)
    assert log.backend.get(k.epoch) == b"1" and log.backend.get(k.fence(k.cluster)) == b"1"
    assert store.pending(k.inbox(k.cluster), "jm") == pending_at_1000 != []
    assert log.backend.hgetall(k.table(k.cluster, "t")) == {b"row1000": b"1"}
    assert log.backend.hgetall_with_ttl(k.leader) == ({}, -2)  # its expiry survived too
    clock.now = 1_100
    assert log.backend.hgetall_with_ttl(k.leader) == ({b"holder": b"leader1000", b"epoch": b"1"}, 200)


def test_a_restart_keeps_a_script_whole_or_loses_it_whole(store: MemoryStore, clock: Clock) -> None:
    log = log_on(store)
    tag = log.keys.cluster
    facts = log.keys.facts(tag)
    log.commit(tag, 1, [Out(facts, env(registered("a")))])
    clock.now = 1_001
    log.commit(tag, 2, [Out(facts, env(registered("b"))), Out(facts, env(registered("c")))])
    store.crash(lose_after_ms=1_000)
    log = log_on(store)
    assert log.length(facts) == 1 and log.backend.get(log.keys.fence(tag)) == b"1"


def test_ids_after_a_restart_never_repeat_a_surviving_one(store: MemoryStore, clock: Clock) -> None:
    log = log_on(store)
    stream = log.keys.inbox(log.keys.cluster)
    kept = [log.backend.xadd(stream, {b"n": b"1"}) for _ in range(3)]
    assert kept == ["1000-0", "1000-1", "1000-2"]
    clock.now = 1_500
    lost = log.backend.xadd(stream, {b"n": b"lost"})
    store.crash(lose_after_ms=1_000)
    log = log_on(store)
    assert log.backend.last_id(stream) == "1000-2"
    clock.now = 900  # a clock that went back: ids still go up
    assert log.backend.xadd(stream, {b"n": b"2"}) == "1000-3"
    clock.now = 1_500  # the lost entry's id can come again (as with Redis): it is not in the log any more
    assert log.backend.xadd(stream, {b"n": b"3"}) == lost
    assert [i for i, _ in log.backend.xrange(stream, None, 10)] == kept + ["1000-3", lost]


def test_losing_more_than_the_window_is_refused(clock: Clock) -> None:
    store = MemoryStore(clock, aof_window_ms=1_000, compact_records=10)
    b = MemoryBackend(store)
    for t in range(0, 5_000, 100):
        clock.now = 10_000 + t
        b.xadd("{t:cluster}:inbox", {b"n": str(t).encode()})
    with pytest.raises(ValueError, match="snapshot"):
        store.crash(lose_after_ms=10_000)
    store.crash(lose_after_ms=clock.now - 1_000)
    assert MemoryBackend(store).last_id("{t:cluster}:inbox") == f"{clock.now - 1_000}-0"


def test_reads_are_not_recorded(store: MemoryStore, clock: Clock) -> None:
    log = log_on(store)
    workload(log, clock)
    k = log.keys
    c = GroupConsumer(log, k.inbox(k.cluster), "jm", "c2")
    assert c.read(block_ms=None) != []  # a write: entries become pending
    recorded = len(store._aof)
    b = log.backend
    b.xrange(k.inbox(k.cluster), None, 10), b.xread({k.inbox(k.cluster): "0"}, count=10, block_ms=None)
    (
        b.get(k.epoch),
        b.hgetall(k.leader),
        b.hgetall_with_ttl(k.leader),
        b.exists(k.leader),
        b.group_state(k.inbox(k.cluster), "jm"),
        b.scan_streams(k.pattern),
        b.last_id(k.facts(k.cluster)),
        b.server_id(),
    )
    b.script("project", [k.position(k.cluster, "t"), k.table(k.cluster, "t")], ["", "not this", "1-0", 0])
    assert len(store._aof) == recorded


def test_a_restart_forgets_what_redis_does_not_write_to_its_aof(store: MemoryStore, clock: Clock) -> None:
    """Reading one's own pending entries again counts a delivery and restarts their idle
    time, but Redis does not write that to its AOF: after a restart they are as idle as
    they were before the re-read (and another consumer may claim them at once)."""
    b = MemoryBackend(store)
    stream = "{t:cluster}:inbox"
    (entry,) = [b.xadd(stream, {b"n": b"1"})]
    b.group_create(stream, "g", "0")
    b.xreadgroup("g", "a", {stream: ">"}, count=1, block_ms=None)
    clock.now = 2_000
    assert [i for _, i, _ in b.xreadgroup("g", "a", {stream: "0"}, count=1, block_ms=None)] == [entry]
    assert store.pending(stream, "g") == [PendingEntry(entry, "a", 2_000, 2)]
    assert b.xautoclaim(stream, "g", "b", min_idle_ms=500, start="0-0", count=1) == ("0-0", [])
    store.crash()
    b = MemoryBackend(store)
    assert store.pending(stream, "g") == [PendingEntry(entry, "a", 1_000, 1)]
    assert b.xautoclaim(stream, "g", "b", min_idle_ms=500, start="0-0", count=1) == ("0-0", [(entry, {b"n": b"1"})])
    # What XAUTOCLAIM writes is absolute (XCLAIM ... TIME ... RETRYCOUNT), so it survives.
    store.crash()
    assert store.pending(stream, "g") == [PendingEntry(entry, "b", 2_000, 2)]


@pytest.mark.parametrize("seed", range(20))
def test_a_restart_at_any_time_in_the_window_gives_the_state_of_that_time(seed: int) -> None:
    """A random workload over the whole Backend; after every step the state is kept; then a
    crash at a random time must rebuild exactly the state of that time (this also proves
    every mutation is recorded, compaction included)."""
    rng = random.Random(seed)
    clock = Clock(10_000)
    store = MemoryStore(clock, seed=seed, aof_window_ms=2_000, compact_records=50)
    states: list[tuple[int, dict]] = []
    for _ in range(400):
        random_call(rng, MemoryBackend(store), clock, reread=False)
        states.append((clock.now, store.dump()))
    lose_after = rng.randrange(clock.now - 2_000, clock.now + 1)
    expected = [s for t, s in states if t <= lose_after][-1]
    store.crash(lose_after_ms=lose_after)
    assert store.dump() == expected


def random_call(rng: random.Random, b: MemoryBackend, clock: Clock, *, reread: bool = True) -> None:
    """One random call of the kinds Sluice makes, on a few keys (errors are part of it);
    ``reread``: also XREADGROUP with an id (its delivery counts do not survive a restart)."""
    clock.now += rng.choice([0, 0, 1, 5, 40, 300])
    streams = ["{t:cluster}:inbox", "{t:cluster}:facts", "{t:job:j}:inbox"]
    s = rng.choice(streams)
    ids = [i for i, _ in b.xrange(s, None, 100)]
    some = rng.sample(ids, min(len(ids), rng.randint(1, 3))) if ids else ["1-0"]
    calls = [
        lambda: b.xadd(s, {b"n": str(rng.random()).encode()}),
        lambda: b.xadd_many([(rng.choice(streams), {b"n": b"x"}) for _ in range(rng.randint(1, 4))]),
        lambda: b.group_create(s, rng.choice("gh"), rng.choice(["0", "$"])),
        lambda: b.xreadgroup(
            rng.choice("gh"),
            rng.choice("ab"),
            {s: rng.choice([">", ">", "0" if reread else ">"])},
            count=rng.randint(1, 5),
            block_ms=None,
        ),
        lambda: b.xautoclaim(
            s,
            rng.choice("gh"),
            rng.choice("ab"),
            min_idle_ms=rng.choice([0, 50, 500]),
            start="0-0",
            count=rng.randint(1, 4),
        ),
        lambda: b.xack(s, rng.choice("gh"), some),
        lambda: b.xtrim_minid(s, rng.choice(some)),
        lambda: b.group_setid(s, rng.choice("gh"), rng.choice(["0", "$"] + some)),
        lambda: b.set("{t:cluster}:s", str(rng.random()).encode(), nx=rng.random() < 0.5),
        lambda: b.delete(rng.choice(["{t:cluster}:s", "{t:cluster}:h", "{t:cluster}:leader", s])),
        lambda: b.hset("{t:cluster}:h", {rng.choice("xyz"): b"1"}),
        lambda: b.script(
            "lease_acquire",
            ["{t:cluster}:leader", "{t:cluster}:epoch", "{t:cluster}:fence"],
            [rng.choice("ab"), rng.choice([0, 100, 1000])],
        ),
        lambda: b.script("lease_renew", ["{t:cluster}:leader"], [rng.choice("ab"), rng.randint(0, 3), 200, ""]),
        lambda: b.script("lease_release", ["{t:cluster}:leader"], [rng.choice("ab"), rng.randint(0, 3)]),
        lambda: b.script("fence", ["{t:cluster}:fence"], [rng.randint(0, 5), ""]),
        lambda: b.script(
            "commit",
            ["{t:cluster}:fence", "{t:cluster}:inbox", "{t:cluster}:facts", "{t:cluster}:cursor"],
            [
                rng.randint(0, 5),
                "",
                rng.choice(["", "g"]),
                len(some),
                *some,
                rng.choice([0, 4]),
                f"{rng.randint(0, 9)}-0",
                3,
                b"e",
                "",
            ],
        ),
        lambda: b.script("dead_letter", [s, "{t:cluster}:dead"], [rng.choice(["", "g"]), some[0], "k", "r"]),
        lambda: b.script(
            "deliver", ["{t:tm:x}:inbox", "{t:tm:x}:delivered"], ["", "o", f"{clock.now}-{rng.randint(0, 2)}", b"e"]
        ),
        lambda: b.script("advance_cursor", ["{t:cluster}:cursor"], ["", f"{rng.randint(0, 9)}-0"]),
        lambda: b.script(
            "project",
            ["{t:cluster}:pos", "{t:cluster}:h"],
            [
                "",
                rng.choice(["", "1-0", "2-0"]),
                rng.choice(["1-0", "2-0"]),
                1,
                rng.choice("xyz"),
                b"v",
                rng.choice("xyz"),
            ],
        ),
    ]
    try:
        rng.choice(calls)()
    except Exception as exc:  # noqa: BLE001 - WRONGTYPE, NOGROUP, stale epochs: all part of the workload
        assert type(exc).__name__ in ("CommandError", "NoGroup", "ScriptFailed"), exc


@pytest.mark.parametrize("seed", range(5))
def test_the_same_calls_on_the_same_clock_give_the_same_state(seed: int) -> None:
    def run() -> tuple[list, dict, str]:
        rng, clock = random.Random(seed), Clock(10_000)
        store = MemoryStore(clock, seed=seed)
        b = MemoryBackend(store)
        replies = []
        for i in range(300):
            random_call(rng, b, clock)
            replies.append(b.xrange("{t:cluster}:inbox", None, 1000))
            if i % 100 == 99:
                store.crash(lose_after_ms=clock.now - rng.randint(0, 500))
                b = MemoryBackend(store)
        return replies, store.dump(), store.run_id

    assert run() == run()


# --- connections -------------------------------------------------------------------------------


def test_the_first_call_of_a_connection_after_a_restart_fails(store: MemoryStore) -> None:
    old, other = MemoryBackend(store, "old"), MemoryBackend(store, "other")
    old.xadd("{t:cluster}:inbox", {b"n": b"1"})
    store.crash()
    with pytest.raises(RedisUnavailable, match="reset"):
        old.xadd("{t:cluster}:inbox", {b"n": b"2"})
    assert old.xlen("{t:cluster}:inbox") == 1  # the failed call did nothing; the next one works
    with pytest.raises(RedisUnavailable):
        other.server_id()
    assert other.server_id() == store.run_id
    assert MemoryBackend(store).xlen("{t:cluster}:inbox") == 1  # a new connection never saw the old server


def test_a_silent_reconnect_hides_the_restart(clock: Clock) -> None:
    store = MemoryStore(clock, silent_reconnect=True)
    b = MemoryBackend(store)
    first = b.server_id()
    store.crash()
    assert b.server_id() == store.run_id != first


def test_a_server_that_is_down_answers_nothing(store: MemoryStore) -> None:
    b = MemoryBackend(store, "jm-1")
    store.down = True
    for call in (
        b.server_id,
        b.time_ms,
        lambda: b.get("x"),
        lambda: b.xadd("s", {b"a": b"1"}),
        lambda: b.script("fence", ["{t:cluster}:fence"], [1, ""]),
    ):
        with pytest.raises(RedisUnavailable, match="memory://jm-1"):
            call()
    assert b.describe() == "memory://jm-1" and b.address() is None
    store.down = False
    assert b.get("x") is None and MemoryStore(Clock()).streams() == []


def test_a_writer_pinned_to_the_old_run_id_is_refused_after_a_restart(store: MemoryStore, clock: Clock) -> None:
    log = log_on(store)
    k = log.keys
    tag = k.cluster
    server = log.server_id()
    lease = LeaderLease(log, "a", 1_000)
    assert lease.try_acquire() == 1
    lease.server = server
    log.commit(tag, 1, [Out(k.outbox(tag), env(heartbeat()), to=k.inbox(k.taskmanager("tm-1")))], server=server)
    store.crash()
    log = log_on(store)  # a fresh connection: no reset to get through
    lease.log = log
    with pytest.raises(StoreRestarted) as info:
        log.commit(tag, 1, [Out(k.facts(tag), env(registered("a")))], server=server)
    assert info.value.run_id == store.run_id
    with pytest.raises(StoreRestarted):
        log.fence(tag, 1, server=server)
    with pytest.raises(StoreRestarted):
        Deliverer(log, tag).deliver(server=server)
    with pytest.raises(ScriptFailed, match="^SLUICE_RESTARTED " + store.run_id):
        log.backend.script("advance_cursor", [k.outbox_cursor(tag)], [server, "1-0"])
    assert not lease.renew()
    assert log.length(k.facts(tag)) == 0 and log.length(k.inbox(k.taskmanager("tm-1"))) == 0
    # Writers that looked again after the restart carry on.
    assert not log.commit(tag, 1, [Out(k.facts(tag), env(registered("a")))], server=log.server_id()).duplicate
    assert Deliverer(log, tag).deliver(server=log.server_id()) == 1


# --- what the simulator looks at -------------------------------------------------------------


def test_the_simulators_view_of_streams_groups_and_pending_entries(store: MemoryStore, clock: Clock) -> None:
    b = MemoryBackend(store)
    ids = [b.xadd("{t:cluster}:inbox", {b"n": str(i).encode()}) for i in range(3)]
    b.hset("{t:cluster}:h", {"a": b"1"})
    b.group_create("{t:cluster}:inbox", "g", "0")
    b.xreadgroup("g", "c1", {"{t:cluster}:inbox": ">"}, count=2, block_ms=None)
    clock.now += 50
    b.xreadgroup("g", "c1", {"{t:cluster}:inbox": "0"}, count=1, block_ms=None)  # read again: 2 deliveries
    b.xautoclaim("{t:cluster}:inbox", "g", "c2", min_idle_ms=50, start="0-0", count=10)
    assert store.streams() == ["{t:cluster}:inbox"]
    assert store.entries("{t:cluster}:inbox") == [(i, {b"n": str(n).encode()}) for n, i in enumerate(ids)]
    assert store.entries("{t:cluster}:h") == [] and store.pending("{t:cluster}:inbox", "nope") == []
    assert store.groups("{t:cluster}:inbox") == {"g": ids[1]}
    assert store.pending("{t:cluster}:inbox", "g") == [
        PendingEntry(ids[0], "c1", 1050, 2),
        PendingEntry(ids[1], "c2", 1050, 2),
    ]


def test_expiry_is_exact_to_the_millisecond(store: MemoryStore, clock: Clock) -> None:
    log = log_on(store)
    lease = LeaderLease(log, "a", 200)
    assert lease.try_acquire() == 1  # at 1000: held up to 1200 included
    clock.now = 1_199
    assert log.backend.hgetall_with_ttl(log.keys.leader)[1] == 1
    clock.now = 1_201
    assert log.backend.hgetall_with_ttl(log.keys.leader) == ({}, -2)
    assert LeaderLease(log, "b", 200).try_acquire() == 2
    # A lease time that is not in the future deletes the key, as PEXPIRE does.
    assert log.backend.script(
        "lease_acquire", [log.keys.leader, log.keys.epoch, log.keys.fence(log.keys.cluster)], ["b", 0]
    ) == [2, 0]
    assert log.backend.hgetall_with_ttl(log.keys.leader) == ({}, -2)


def test_a_standby_at_the_last_millisecond_of_the_lease_does_not_lead(store: MemoryStore, clock: Clock) -> None:
    """At the lease's last millisecond the holder's PTTL is 0; LEASE_ACQUIRE used to answer
    {epoch, -0}, which reads as 'renewed', and the standby led at the leader's epoch."""
    log = log_on(store)
    assert LeaderLease(log, "a", 200).try_acquire() == 1
    clock.now = 1_200
    assert LeaderLease(log, "b", 200).try_acquire() is None
    assert log.backend.script(
        "lease_acquire", [log.keys.leader, log.keys.epoch, log.keys.fence(log.keys.cluster)], ["b", 200]
    ) == [1, -1]
    clock.now = 1_201
    assert LeaderLease(log, "b", 200).try_acquire() == 2


def test_a_fault_wrapper_sees_a_write_that_took_effect_but_whose_reply_was_lost(store: MemoryStore) -> None:
    class LoseReply(Delegating):
        def around(self, name, call):
            call()
            raise RedisUnavailable("reply lost")

    log = EventLog(LoseReply(MemoryBackend(store)), Keys("t"))
    with pytest.raises(RedisUnavailable):
        log.append(log.keys.inbox(log.keys.cluster), env(heartbeat()))
    assert len(store.entries(log.keys.inbox(log.keys.cluster))) == 1


def test_maxlen_trims_exactly_and_a_deleted_stream_starts_again(store: MemoryStore, clock: Clock) -> None:
    """Redis's ``MAXLEN ~`` trims whole nodes and may keep more; this store keeps exactly
    ``maxlen`` (both keep at least that many). A stream deleted and written again starts
    its ids again from the clock, as in Redis."""
    b = MemoryBackend(store)
    stream = "{t:cluster}:inbox"
    ids = [b.xadd(stream, {b"n": str(i).encode()}, maxlen=3) for i in range(5)]
    assert [i for i, _ in b.xrange(stream, None, 10)] == ids[2:]
    assert b.delete(stream) == 1 and b.xlen(stream) == 0 and store.streams() == []
    assert b.xadd(stream, {b"n": b"again"}) == "1000-0"


def test_setting_an_inbox_aside_keeps_its_value_and_time_to_live_as_rename_does(
    store: MemoryStore, clock: Clock
) -> None:
    """The twin of SET_ASIDE (store/scripts.py): Redis's RENAME keeps the key's TTL."""
    log = log_on(store)
    inbox = log.keys.inbox(log.keys.job("j1"))
    log.backend.set(inbox, b"someone else's")
    store._pexpire(inbox, b"5000", clock.now)
    (moved,) = log.set_aside([inbox], "jm")
    assert moved == inbox
    (aside,) = [k for k in store._state.data if k.startswith(inbox + ":not-a-stream:")]
    assert log.backend.get(aside) == b"someone else's" and store._pttl(aside, clock.now) == 5000
    assert store._pttl(inbox, clock.now) == -1  # the inbox made again: a stream, no TTL
    clock.now += 5001
    assert log.backend.get(aside) is None
