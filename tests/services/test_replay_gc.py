"""A replay folds its pages with the cyclic collector off and freezes what it built between
pages (services/jobmanager/leadership.py); when it ends, in success or error, the collector
is as it was and nothing stays frozen."""

from __future__ import annotations

import gc
import time

import pytest

from sluice.errors import NotJSON
from sluice.events import FIELD, JobRegistered, TaskManagerRegistered
from sluice.services.jobmanager.leadership import Replay
from sluice.store import EventLog, Keys
from sluice.store.memory import MemoryBackend, MemoryStore
from tests.helpers import env


def _log() -> EventLog:
    log = EventLog(MemoryBackend(MemoryStore(clock=lambda: time.time_ns() // 1_000_000), "test"), Keys("gc"))
    stream = log.keys.facts(log.keys.cluster)
    log.append_batch(stream, [env(TaskManagerRegistered(f"tm-{i}", "s", "h", 1)) for i in range(20)])
    return log


def _run(replay: Replay) -> int:
    steps = 0
    while not replay.step():
        steps += 1
        assert gc.isenabled()  # between pages the collector runs as usual
    return steps


def test_a_replay_leaves_nothing_frozen_and_the_collector_on() -> None:
    log = _log()
    assert gc.isenabled() and gc.get_freeze_count() == 0
    replay = Replay(log, lambda tag: None, page=3, snapshots=False)
    assert _run(replay) > 3
    assert replay.result.facts == 20
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_replay_that_fails_leaves_nothing_frozen() -> None:
    log = _log()
    stream = log.keys.facts(log.keys.cluster)
    log.append_raw(stream, {FIELD: b"{not json"})
    replay = Replay(log, lambda tag: None, page=3, snapshots=False)
    with pytest.raises(NotJSON):
        _run(replay)
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_replay_keeps_the_collector_off_if_it_was() -> None:
    log = _log()
    log.append_batch(log.keys.facts(log.keys.cluster), [env(JobRegistered("j", "j"))])
    gc.disable()
    try:
        replay = Replay(log, lambda tag: None, page=3, snapshots=False)
        while not replay.step():
            assert not gc.isenabled()
    finally:
        gc.enable()
    assert gc.get_freeze_count() == 0
