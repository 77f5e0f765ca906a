"""Replay a page at a time (``EventLog.replay_pages``, what a JobManager's replay reads):
the same entries as ``replay``, and a malformed entry still raises DecodeError naming its
stream and entry, on Redis and on the simulation's in-memory store."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from sluice.errors import DecodeError, MalformedEnvelope, NotJSON, UnknownEventType
from sluice.events import FIELD, TaskManagerRegistered, encode
from sluice.store import EventLog, Keys
from sluice.store.memory import MemoryBackend, MemoryStore
from tests.helpers import env


@pytest.fixture(params=["redis", "memory"])
def any_log(request: pytest.FixtureRequest, keys: Keys) -> Iterator[EventLog]:
    if request.param == "redis":
        yield request.getfixturevalue("log")
    else:
        yield EventLog(MemoryBackend(MemoryStore(clock=lambda: time.time_ns() // 1_000_000), "test"), keys)


def _facts(log: EventLog, n: int) -> tuple[str, list[str]]:
    stream = log.keys.facts(log.keys.cluster)
    ids = log.append_batch(stream, [env(TaskManagerRegistered(f"tm-{i}", "s", "h", 1)) for i in range(n)])
    return stream, ids


@pytest.mark.parametrize("page", [1, 3, 7, 10, 1000])
def test_pages_hold_what_replay_gives_in_order(any_log: EventLog, page: int) -> None:
    stream, ids = _facts(any_log, 10)
    pages = list(any_log.replay_pages(stream, page=page))
    assert all(0 < len(p) <= page for p in pages)
    assert [e for p in pages for e in p] == list(any_log.replay(stream, page=page))
    assert [i for p in pages for i, _ in p] == ids
    assert [i for p in any_log.replay_pages(stream, ids[3], page=page) for i, _ in p] == ids[4:]
    assert list(any_log.replay_pages(stream, ids[-1], page=page)) == []


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({FIELD: b"{not json"}, NotJSON),
        ({b"other": b"x"}, MalformedEnvelope),
        (
            {
                FIELD: b'{"type": "NoSuchEvent", "v": 1, "id": "x", "job": null, "epoch": 0, "ts": 0, "cause": null, '
                b'"payload": {}}'
            },
            UnknownEventType,
        ),
        (
            {
                FIELD: b'{"type": ["a"], "v": 1, "id": "x", "job": null, "epoch": 0, "ts": 0, "cause": null, '
                b'"payload": {}}'
            },
            MalformedEnvelope,
        ),
    ],
)
def test_a_malformed_entry_raises_naming_stream_and_entry(
    any_log: EventLog, fields: dict[bytes, bytes], error: type[DecodeError]
) -> None:
    stream, ids = _facts(any_log, 4)
    bad = any_log.append_raw(stream, fields)
    any_log.append_batch(stream, [env(TaskManagerRegistered("tm-x", "s", "h", 1))])
    with pytest.raises(error) as pages_raised:
        list(any_log.replay_pages(stream, page=3))
    assert stream in str(pages_raised.value) and bad in str(pages_raised.value)
    got = []
    with pytest.raises(error) as replay_raised:
        for entry_id, _ in any_log.replay(stream, page=3):
            got.append(entry_id)
    assert got == ids  # replay still gives the entries before the bad one, then raises
    assert stream in str(replay_raised.value) and bad in str(replay_raised.value)


def test_an_entry_with_more_fields_than_the_envelope_still_decodes(any_log: EventLog) -> None:
    stream, ids = _facts(any_log, 2)
    extra = env(TaskManagerRegistered("tm-x", "s", "h", 1))
    any_log.append_raw(stream, {FIELD: encode(extra), b"note": b"by hand"})
    assert [e for p in any_log.replay_pages(stream) for _, e in p][-1] == extra
    assert [e for _, e in any_log.replay(stream)][-1] == extra
