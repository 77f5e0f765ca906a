"""The simulation with the log on shards (``scripts/simulate --shards N``): each shard fails
over alone and loses its own last second; the invariants hold. A few seeds here (the long
run is ``scripts/simulate --shards 3 --all-faults --seeds 200``, and ``-m slow``)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
import structlog

from sluice.events import Envelope, LogRestarted, TaskManagerLost
from sluice.services.jobmanager.restarts import rewinds
from sluice.store.keys import Keys
from sluice.store.log import EventLog, Out
from sluice.store.memory import MemoryBackend, MemoryStore
from sluice.store.outbox import Deliverer
from sluice.store.shards import keeps_every_write, sharded
from tools.sim.cli import digest
from tools.sim.cluster import Simulation, run_seed
from tools.sim.config import SimConfig
from tools.sim.faults import Faults
from tools.sim.notes import quiet_logging


@pytest.fixture(autouse=True, scope="module")
def _quiet() -> Iterator[None]:
    before = structlog.get_config()
    quiet_logging()
    yield
    structlog.configure(**before)


def test_a_failover_is_a_restart_that_may_lose_whatever_appendfsync() -> None:
    one, cluster = "ab" * 20, "cluster:127.0.0.1:7000=" + "ab" * 20
    assert not sharded(one) and sharded(cluster) and sharded("ab:cd,ef:01")
    assert keeps_every_write(True, one) and not keeps_every_write(False, one)
    assert not keeps_every_write(True, cluster)
    restarted = [LogRestarted("a", "b", 5, "why"), TaskManagerLost("tm0", "s", "why")]
    assert rewinds(restarted, cluster) and not rewinds(restarted, one) and not rewinds([], cluster)


def _shard_seed(seed: int) -> tuple[str, int, str]:
    outcome = run_seed(seed, shards=3, faults=Faults.swarm(random.Random(seed), all_on=True), fault_steps=600)
    return digest(outcome.__dict__), outcome.ok, outcome.violation or ""


def test_a_rewound_outbox_delivers_again_what_a_failed_over_inbox_lost() -> None:
    """The cluster's outbox (one shard) delivered to a TaskManager's inbox (another shard),
    whose failover lost the delivery; the cursor stayed past it. From the cursor nothing is
    delivered again; rewound, the entry is, once (the inbox's mark was lost with it)."""
    now = [1000]
    store = MemoryStore(lambda: now[0], shards=3)
    keys = Keys("fo")
    tm = next(
        keys.taskmanager(f"tm{i}")
        for i in range(50)
        if store.shard_of(keys.taskmanager(f"tm{i}")) != store.shard_of(keys.cluster)
    )
    log = EventLog(MemoryBackend(store), keys)
    server = log.server_id()
    ev = Envelope(TaskManagerLost("tm", "s", "why"), "0" * 32, 1, 0, None, None)
    log.commit(keys.cluster, 1, [Out(keys.outbox(keys.cluster), ev, to=keys.inbox(tm))], server=server)
    now[0] = 2000
    assert Deliverer(log, keys.cluster).deliver(server=server) == 1
    store.failover(store.shard_of(tm), lose_after_ms=1500)
    log = EventLog(MemoryBackend(store), keys)
    assert log.backend.xlen(keys.inbox(tm)) == 0
    assert Deliverer(log, keys.cluster).deliver(server=log.server_id()) == 0  # the cursor is past it
    d = Deliverer(log, keys.cluster)
    d.rewind()
    assert d.deliver(server=log.server_id()) == 1 and d.deliver(server=log.server_id()) == 0
    again = Deliverer(log, keys.cluster)
    again.rewind()
    assert again.deliver(server=log.server_id()) == 0  # the inbox's mark drops it now
    assert log.backend.xlen(keys.inbox(tm)) == 1


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", [3, 11])
def test_seeds_whose_shards_fail_over_keep_the_invariants(seed: int) -> None:
    """Failovers of the shard that holds the cluster's tag and of the one that holds the job's
    (seed 3: every shard, seed 11: the job's)."""
    sim = Simulation(SimConfig(seed, shards=3, faults=Faults({"shard_failover": 5.0}), fault_steps=400, jobs=1))
    out = sim.run()
    assert out.ok, out.trace
    assert sim.store.failovers[sim.store.shard_of(sim.keys.job("job0"))] > 0


@pytest.mark.slow
@pytest.mark.parametrize("seed", [4, 6])
def test_a_cut_across_shards(seed: int) -> None:
    """Seed 6: the cluster's tag keeps a job archived while the failover of the job's shard
    lost the facts of its end (the log says RUNNING; no leader served it before it was
    reconciled). Seed 4: the failover of the cluster tag's shard lost a job's registration,
    while the job's shard kept its facts. A restart of one Redis never cuts across tags
    like this; a new leader reconciles them (services/jobmanager/restarts.py ``reconcile``)."""
    out = Simulation(SimConfig(seed, shards=3, faults=Faults({"shard_failover": 5.0}), fault_steps=400, jobs=1)).run()
    assert out.ok, out.violation


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_seeds_with_shards_under_every_fault_replay_exactly() -> None:
    for seed in (1, 6):
        digest_, ok, violation = _shard_seed(seed)
        assert ok, violation
        assert _shard_seed(seed)[0] == digest_


def test_the_cli_runs_a_seed_on_shards_and_refuses_a_bad_count() -> None:
    from click.testing import CliRunner

    from tools.sim.cli import main

    done = CliRunner().invoke(main, ["--seed", "3", "--shards", "3", "--steps", "300"])
    assert done.exit_code == 0, done.output
    assert "shard_failover" in done.output and "replayed: identical" in done.output
    bad = CliRunner().invoke(main, ["--seed", "3", "--shards", "0"])
    assert bad.exit_code == 2 and "--shards" in bad.output


def _sharded_ids(store: MemoryStore, shard: int) -> tuple[str, str]:
    before = store.identity()
    store.failover(shard)
    return before, store.identity()


def test_a_failover_is_recovered_on_its_shard_only() -> None:
    """The jobs and TaskManagers whose tag is on the shard that failed over pay; the others
    run on. The cluster's tag there: every TaskManager registers again."""
    from sluice.services.jobmanager.restarts import log_restarted
    from sluice.services.membership.core import Membership, TaskManagerRow
    from sluice.store.shards import in_slots, keyslot

    keys = Keys("fo")
    store = MemoryStore(lambda: 1000, shards=3)
    cluster = store.shard_of(keys.cluster)
    other = next(i for i in range(3) if i != cluster)
    tms = {f"tm{i}": store.shard_of(keys.taskmanager(f"tm{i}")) for i in range(12)}
    members = Membership(
        taskmanagers={rid: TaskManagerRow(rid, "s", "h", 1, {}, "REGISTERED", 0, None, 1) for rid in sorted(tms)}
    )
    log = structlog.get_logger()
    before, now = _sharded_ids(store, other)
    facts = log_restarted(before, now, 5000, members, log, keys)
    restart = facts[0]
    assert isinstance(restart, LogRestarted) and restart.attempt_floor == 5000
    assert restart.slots is not None and len(restart.slots) == 1
    assert not in_slots(keyslot(keys.cluster), [(a, b) for a, b in restart.slots])
    lost = {f.resource_id for f in facts[1:] if isinstance(f, TaskManagerLost)}
    assert lost == {rid for rid, shard in tms.items() if shard == other} and lost != set(tms)
    before, now = _sharded_ids(store, cluster)  # the cluster's tag: every TaskManager
    facts = log_restarted(before, now, 6000, members, log, keys)
    assert {f.resource_id for f in facts[1:] if isinstance(f, TaskManagerLost)} == set(tms)
    one = log_restarted("a" * 40, "b" * 40, 7000, members, log, keys)  # one Redis: all of it, as ever
    assert one[0].slots is None and len(one) == 1 + len(tms)  # type: ignore[attr-defined]


def test_each_job_owes_the_floor_of_its_shards_restarts() -> None:
    from sluice.services.membership.core import Membership, evolve

    m = Membership()

    def fold(ev: LogRestarted) -> None:
        evolve(m, Envelope(ev, "0" * 32, 1, 0, None, None))

    fold(LogRestarted("a", "b", 10, "one shard", [[0, 99]]))
    assert (m.owed_floor(50), m.owed_floor(100), m.attempt_floor) == (10, 0, 10)
    fold(LogRestarted("b", "c", 20, "another", [[100, 199]]))
    assert (m.owed_floor(50), m.owed_floor(150), m.owed_floor(5000)) == (10, 20, 0)
    fold(LogRestarted("c", "d", 30, "one Redis"))  # the whole log: every slot, the others folded in
    assert m.restarted == [[0, 16383, 30]] and m.owed_floor(50) == m.owed_floor(9999) == 30


def test_a_v1_log_restarted_reads_as_a_restart_of_the_whole_log() -> None:
    import orjson

    from sluice.events.envelope import decode, encode

    current = Envelope(LogRestarted("a", "b", 5, "why"), "id", 4, 5)
    v1 = orjson.loads(encode(current))
    v1["v"] = 1
    del v1["payload"]["slots"]
    assert LogRestarted.VERSION == 2 and decode(orjson.dumps(v1)) == current
    v2 = orjson.loads(encode(current))
    v2["payload"]["shards"] = [1]  # an unknown field is refused
    with pytest.raises(Exception, match="shards"):
        decode(orjson.dumps(v2))


def test_a_new_leader_reconciles_what_a_failover_cut_across_tags() -> None:
    """The cluster tag's shard lost a registration the job's own facts tell of: registered
    again. A job's shard lost what it wrote lately while the cluster's tag keeps it
    archived: rebuilt from its own facts. Archived jobs on a shard that kept its writes stay."""
    from sluice.events import LeadershipGranted
    from sluice.services.jobmanager.leadership import Rebuilt
    from sluice.services.jobmanager.restarts import reconcile

    store = MemoryStore(lambda: 1000, shards=3)
    keys = Keys("fo")
    log = EventLog(MemoryBackend(store), keys)
    cluster = store.shard_of(keys.cluster)
    other, safe = (i for i in range(3) if i != cluster)

    def on(shard: int, kind: str) -> str:
        return next(f"{kind}{i}" for i in range(500) if store.shard_of(keys.job(f"{kind}{i}")) == shard)

    kept, there, elsewhere = on(other, "kept"), on(other, "arch"), on(safe, "arch")
    server = log.server_id()
    ev = Envelope(TaskManagerLost("tm", "s", "why"), "0" * 32, 1, 0, None, None)
    for job_id in (kept, there, elsewhere):
        log.commit(keys.job(job_id), 1, [Out(keys.facts(keys.job(job_id)), ev)], server=server)
    store.failover(cluster)
    store.failover(other)
    log = EventLog(MemoryBackend(store), keys)  # (a new connection: the old one was reset)
    r = Rebuilt(registered=[there, elsewhere], archived=[there, elsewhere])
    r.last_grant = LeadershipGranted(1, "jm", "h", server)
    reconcile(log, r, log.server_id(), None)
    assert r.found == {kept: ""} and r.registered == [there, elsewhere, kept]
    assert r.archived == [elsewhere] and r.live == [there, kept]
    untouched = Rebuilt(registered=[there], archived=[there])
    reconcile(EventLog(MemoryBackend(MemoryStore(lambda: 1000)), keys), untouched, "ab" * 20, ("cd" * 20, "ab" * 20))
    assert untouched.archived == [there] and not untouched.found  # one Redis: nothing to reconcile
