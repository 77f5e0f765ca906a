"""Fixtures of the store's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sluice.store import EventLog, Keys, connect
from tests.conftest import RQ_PREFIX


@pytest.fixture
def rq_log(redis_url: str) -> Iterator[EventLog]:
    """The log under the prefix RQ has in this process (RQ takes one a process), emptied of
    its keys (the log's and RQ's, all under ``{trq:``) before and after."""
    client = connect(redis_url)
    keys = Keys(RQ_PREFIX)

    def empty() -> None:
        for key in client.scan_iter(match=keys.pattern, count=1000):
            client.delete(key)

    empty()
    yield EventLog(client, keys)
    empty()
    client.close()
