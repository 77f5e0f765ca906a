"""Reading pages ahead of the fold (store/replay_reader.py): the same pages in the same
order as reading them in the caller, an error after the pages before it, and a caller that
stops early stops the reader."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from sluice.errors import RedisUnavailable
from sluice.store import EventLog
from sluice.store.replay_reader import read_ahead


def _stream(n: int, *, fail_after: int | None = None) -> tuple[Any, list[tuple[str, Any]]]:
    entries = [(f"1-{i}", {b"e": b"x"}) for i in range(1, n + 1)]
    calls: list[str | None] = []

    def xrange(stream: str, after: str | None, count: int) -> list[tuple[str, Any]]:
        calls.append(after)
        if fail_after is not None and len(calls) > fail_after:
            raise RedisUnavailable("the server went away")
        seq = 0 if after in (None, "0-0") else int(after.split("-")[1])
        return entries[seq : seq + count]

    return xrange, entries


@pytest.mark.parametrize("n, page", [(0, 3), (1, 3), (9, 3), (10, 3), (10, 1), (10, 100)])
def test_the_pages_are_those_read_in_the_caller(n: int, page: int) -> None:
    xrange, entries = _stream(n)
    pages = list(read_ahead(xrange, "s", "0-0", page))
    assert all(0 < len(p) <= page for p in pages)
    assert [e for p in pages for e in p] == entries
    assert [e for p in read_ahead(xrange, "s", "1-4", page) for e in p] == entries[4:]


def test_an_error_comes_after_the_pages_before_it() -> None:
    xrange, entries = _stream(10, fail_after=2)
    got = []
    with pytest.raises(RedisUnavailable, match="went away"):
        for p in read_ahead(xrange, "s", "0-0", 3):
            got.extend(p)
    assert got == entries[:6]


def test_a_caller_that_stops_early_stops_the_reader() -> None:
    xrange, _ = _stream(1000)
    before = threading.active_count()
    pages = read_ahead(xrange, "s", "0-0", 1)
    next(pages)
    pages.close()  # the generator's end joins the reader
    assert threading.active_count() == before


def test_replay_pages_read_ahead_on_redis(log: EventLog) -> None:
    from sluice.events import TaskManagerRegistered
    from tests.helpers import env

    stream = log.keys.facts(log.keys.cluster)
    ids = log.append_batch(stream, [env(TaskManagerRegistered(f"tm-{i}", "s", "h", 1)) for i in range(25)])
    pages = list(log.replay_pages(stream, page=4))
    assert [i for p in pages for i, _ in p] == ids
    first = log.replay_pages(stream, page=4)
    next(first)
    first.close()  # abandoned mid-stream: nothing left running
    assert not [t for t in threading.enumerate() if t.name.startswith("read-ahead")]
