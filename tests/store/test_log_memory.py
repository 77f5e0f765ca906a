"""The log contract against the in-memory store of the simulation (store/memory.py), on
the wall clock: every test the Redis backends pass, this one passes too."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from sluice.events import FIELD, decode
from sluice.store import EventLog, Keys
from sluice.store.memory import MemoryBackend, MemoryStore
from tests.helpers import env
from tests.store.contract import LogContract, registered


def wall_clock() -> int:
    return time.time_ns() // 1_000_000


class TestLogOnMemory(LogContract):
    @pytest.fixture
    def log(self, keys: Keys) -> Iterator[EventLog]:
        yield EventLog(MemoryBackend(MemoryStore(clock=wall_clock), "test"), keys)

    def test_following_blocks_until_an_entry_arrives(self, log: EventLog) -> None:
        """The memory store never blocks (the simulator moves its clock instead, and runs
        one actor at a time): a follow with nothing new returns at once, and the entry is
        there for the next follow."""
        stream = log.keys.facts(log.keys.cluster)
        first = log.append(stream, env(registered("a")))
        started = time.monotonic()
        assert log.follow({stream: first}, block_ms=5000) == []
        assert time.monotonic() - started < 1
        log.append(stream, env(registered("b")))
        got = log.follow({stream: first}, block_ms=5000)
        assert [decode(f[FIELD]).event.resource_id for _, _, f in got] == ["b"]
