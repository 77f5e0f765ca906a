"""The projector on real Redis: tables equal the fold of the log, each event projected once,
even with two projectors racing and one restarting."""

from __future__ import annotations

import random

from sluice.events import LeadershipGranted, TaskManagerLost, TaskManagerRegistered, TaskManagerUnregistered
from sluice.services.membership.core import Membership, evolve
from sluice.services.projector import Projector
from sluice.services.projector.core import TASKMANAGERS
from sluice.store import EventLog, Out, ReadModels
from tests.helpers import env


def write_facts(log: EventLog, n: int, seed: int) -> None:
    rng = random.Random(seed)
    tag = log.keys.cluster
    outs = []
    for i in range(n):
        rid = f"tm-{rng.randrange(8)}"
        kind = rng.randrange(4)
        if kind == 0:
            fact = TaskManagerLost(rid, "s", "timeout")
        elif kind == 1:
            fact = TaskManagerUnregistered(rid, "s", "bye")
        elif kind == 2:
            fact = LeadershipGranted(rng.randrange(1, 5), f"jm-{i}", "h")
        else:
            fact = TaskManagerRegistered(rid, "s", "h", rng.randrange(1, 9))
        outs.append(Out(log.keys.facts(tag), env(fact, ts=i)))
    for k in range(0, n, 7):
        log.commit(tag, 0, outs[k : k + 7])


def fold(log: EventLog) -> Membership:
    state = Membership()
    for _, e in log.replay(log.keys.facts(log.keys.cluster)):
        evolve(state, e)
    return state


def table(log: EventLog, name: str) -> dict:
    return ReadModels(log).read(log.keys.cluster, name)[1]


def expected_rows(state: Membership) -> dict:
    return {k: TASKMANAGERS.row(state, k) for k in state.taskmanagers}


def test_the_table_is_the_fold_of_the_log(log: EventLog) -> None:
    write_facts(log, 300, seed=1)
    assert Projector(log).catch_up() == 300
    state = fold(log)
    assert table(log, "taskmanagers") == expected_rows(state)
    assert table(log, "leadership") == {"leader": {"epoch": state.epoch, "leader_id": state.leader_id}}
    position, _ = ReadModels(log).read(log.keys.cluster, "taskmanagers")
    assert position == log.last_id(log.keys.facts(log.keys.cluster))


def test_racing_and_restarting_projectors_apply_each_event_once(log: EventLog) -> None:
    a, b = Projector(log), Projector(log)
    a.load(), b.load()
    for round_ in range(5):
        write_facts(log, 40, seed=round_)
        # Both saw the same position; whoever writes second finds the table moved and reloads.
        a.step(block_ms=None)
        b.step(block_ms=None)
        if round_ == 2:
            a = Projector(log)  # a restart: carries on from the stored table and position
            a.load()
    for p in (a, b):
        p.catch_up()
    assert table(log, "taskmanagers") == expected_rows(fold(log))
    # The in-memory state of each projector equals the fold too (nothing applied twice).
    for p in (a, b):
        tm = next(r for r in p.running if r.projection.name == "taskmanagers")
        assert expected_rows(tm.state) == expected_rows(fold(log))


def test_the_projector_rides_out_redis_going_away_and_coming_back(aof_redis, keys, capsys) -> None:
    """Redis away while the projector runs (and stays away across its reload): it waits,
    says so once, and projects what comes after Redis is back."""
    import threading
    import time

    from sluice.store import connect

    log = EventLog(connect(aof_redis.url), keys)
    write_facts(log, 20, seed=1)
    projector = Projector(log)
    stop = threading.Event()
    runner = threading.Thread(target=projector.run, args=(stop,), kwargs={"block_ms": 50}, daemon=True)
    runner.start()
    try:

        def table_is_fold() -> bool:
            _, rows = ReadModels(log).read(keys.cluster, TASKMANAGERS.name)
            return rows == {rid: row.to_dict() for rid, row in fold(log).taskmanagers.items()}

        deadline = time.monotonic() + 10
        while not table_is_fold():
            assert time.monotonic() < deadline, "the projector did not catch up"
            time.sleep(0.05)
        aof_redis.stop()
        time.sleep(1.5)
        assert runner.is_alive()
        aof_redis.start()
        log = EventLog(connect(aof_redis.url), keys)
        write_facts(log, 20, seed=2)
        deadline = time.monotonic() + 15
        while not table_is_fold():
            assert runner.is_alive() and time.monotonic() < deadline, "the projector did not come back"
            time.sleep(0.05)
    finally:
        stop.set()
        runner.join(10)
    out = capsys.readouterr().out
    assert out.count("Redis is away") == 1 and out.count("Redis is back") == 1
