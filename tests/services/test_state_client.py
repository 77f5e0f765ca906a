"""Queryable state on real Redis: the KvStateLocation table is the fold of the log (and
rebuilding it gives the same table), the client's lookups and its errors, and its cache
following a task that moved."""

from __future__ import annotations

import socket

import orjson
import pytest

from sluice.errors import StateNotRegistered, StateServerUnavailable, UnknownJob, UnknownStateName
from sluice.events import Envelope, KeyGroupRange, NotifyKvStateRegistered, TaskState
from sluice.services.dataplane.keygroups import key_group_of
from sluice.services.projector import Projector
from sluice.services.projector.core import KVSTATE
from sluice.state import StateClient
from sluice.store import EventLog, KvStates, Out, ReadModels, server_address
from tests.services.test_kvstate_core import V, running

WORDS = [f"w{i}" for i in range(300)]


def commit(log: EventLog, facts: list) -> None:
    tag = log.keys.job("j1")
    for i in range(0, len(facts), 50):
        log.commit(
            tag,
            0,
            [Out(log.keys.facts(tag), Envelope(f, f"id-{i}-{k}", 0, 1, "j1")) for k, f in enumerate(facts[i : i + 50])],
        )


def publish(log: EventLog, sim, task, address: str, value_of=lambda w: {"word": w, "count": len(w)}) -> str:
    """What a task does: write its key groups' values, then register them (through the core)."""
    from sluice.services.dataplane.keygroups import key_group_range
    from sluice.services.kvstate.codec import state_id

    start, end = key_group_range(128, len(sim.job.vertices[V].subtasks), task.subtask)
    sid = state_id("j1", "counts", task.execution_id)
    mine = [w for w in WORDS if start <= key_group_of(w, 128) <= end]
    KvStates(log.client, log.keys).write("j1", sid, ((w, orjson.dumps(value_of(w))) for w in mine), {})
    d = sim.tell(NotifyKvStateRegistered("j1", V, KeyGroupRange(start, end), "counts", sid, address, task.execution_id))
    assert d.note is None
    return sid


@pytest.fixture
def published(log: EventLog):
    sim, tasks = running()
    address = server_address(_url(log))
    for t in tasks:
        publish(log, sim, t, address)
    commit(log, sim.log)
    return sim, tasks, address


def _url(log: EventLog) -> str:
    kw = log.client.connection_pool.connection_kwargs
    return f"redis://{kw['host']}:{kw['port']}/{kw.get('db', 0)}"


def test_the_table_is_the_fold_of_the_log_and_rebuilding_it_gives_the_same_table(log: EventLog, published) -> None:
    sim, _, address = published
    p = Projector(log, ())  # no job registered in the cluster's facts: follow this one
    p.add_job("j1")
    p.catch_up()
    p = Projector(log, ())
    p.add_job("j1")
    p.catch_up()
    tag = log.keys.job("j1")
    _, before = ReadModels(log).read(tag, "kvstate")
    assert before == {"counts": KVSTATE.row(sim.job.kvstate, "counts")}
    assert before["counts"]["vertex"] == V and before["counts"]["num_key_groups"] == 128
    assert [(r["start"], r["end"], r["address"]) for r in before["counts"]["ranges"]] == [
        (0, 63, address),
        (64, 127, address),
    ]
    log.client.delete(log.keys.table(tag, "kvstate"), log.keys.position(tag, "kvstate"))
    p = Projector(log, ())
    p.add_job("j1")
    p.catch_up()
    assert ReadModels(log).read(tag, "kvstate")[1] == before


def test_any_key_is_found_through_its_key_group(log: EventLog, published) -> None:
    client = StateClient(log)
    for w in WORDS:
        assert client.get("j1", "counts", w) == {"word": w, "count": len(w)}
    found = client.lookup("j1", "counts", "w7")
    assert found.key_group == key_group_of("w7", 128) and found.vertex == V
    assert client.get("j1", "counts", "not-a-word") is None


def test_unknown_job_and_unknown_name_say_what_is_there(log: EventLog, published) -> None:
    client = StateClient(log)
    with pytest.raises(UnknownJob, match="job not found: nope"):
        client.get("nope", "counts", "w1")
    with pytest.raises(UnknownStateName, match=r"job j1 has no queryable state named 'cnt' \(it publishes 'counts'"):
        client.get("j1", "cnt", "w1")


def test_a_key_group_whose_task_restarts_is_not_registered_and_says_retry(log: EventLog, published) -> None:
    sim, (t0, _), _ = published
    n = len(sim.log)
    sim.report(t0, TaskState.FAILED, "boom")  # the leader unregisters its state (and deletes it)
    commit(log, sim.log[n:])
    KvStates(log.client, log.keys).delete("j1", sim.log[n + 1].state_ids)
    w = next(w for w in WORDS if key_group_of(w, 128) <= 63)
    with pytest.raises(
        StateNotRegistered,
        match=r"has no registered state right now: the task that owns it is "
        r"restarting.*retry in a moment",
    ):
        StateClient(log).get("j1", "counts", w)


def test_a_server_that_does_not_answer_is_named(log: EventLog) -> None:
    sim, tasks = running()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = f"redis://127.0.0.1:{port}/0"
    for t in tasks:
        sim.tell(
            NotifyKvStateRegistered(
                "j1",
                V,
                KeyGroupRange(*((0, 63) if t.subtask == 0 else (64, 127))),
                "counts",
                f"s{t.subtask}",
                dead,
                t.execution_id,
            )
        )
    commit(log, sim.log)
    with pytest.raises(StateServerUnavailable, match=f"the state server at {dead} does not answer"):
        StateClient(log).get("j1", "counts", "w1")


def test_the_cache_follows_a_task_that_moved(log: EventLog, published) -> None:
    sim, (t0, _), address = published
    client = StateClient(log)
    w = next(w for w in WORDS if key_group_of(w, 128) <= 63)
    assert client.get("j1", "counts", w) == {"word": w, "count": len(w)}
    reads = []
    original = client.location
    client.location = lambda *a, **k: reads.append(a) or original(*a, **k)  # count table reads
    assert client.get("j1", "counts", w) == {"word": w, "count": len(w)} and reads == []  # cached
    # The task fails and moves: its state is unregistered and deleted, the new attempt registers.
    n = len(sim.log)
    sim.report(t0, TaskState.FAILED, "moved")
    retired = sim.log[n + 1].state_ids
    sim.now += 1000
    (t0b,) = sim.schedule()
    sim.report(t0b, TaskState.RUNNING)
    publish(log, sim, t0b, address, value_of=lambda w: {"word": w, "count": 1000 + len(w)})
    commit(log, sim.log[n:])
    KvStates(log.client, log.keys).delete("j1", retired)
    found = client.lookup("j1", "counts", w)
    assert found.value == {"word": w, "count": 1000 + len(w)} and found.state_id != retired[0]
    assert len(reads) >= 1  # the cache was refreshed, not bypassed for good
    reads.clear()
    assert client.get("j1", "counts", w) == {"word": w, "count": 1000 + len(w)} and reads == []


def test_state_registered_at_an_old_address_of_the_same_data_is_read_where_the_log_is(log: EventLog) -> None:
    """An embedded cluster's Redis comes back on a new port with its data: the state is found."""
    sim, tasks = running()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for t in tasks:
        publish(log, sim, t, f"redis://127.0.0.1:{port}/0")
    commit(log, sim.log)
    assert StateClient(log).get("j1", "counts", "w1") == {"word": "w1", "count": 2}
