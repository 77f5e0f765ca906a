"""The dashboard's fixtures: a job driven step by step on the session's Redis, the app over
its prefix (Starlette's TestClient), and the app served by uvicorn from a thread (for the
event stream and the browser)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sluice.store import EventLog
from sluice.ui.app import create_app
from sluice.ui.serve import UiServer, bind
from tests.ui.driven import DrivenJob

with warnings.catch_warnings():  # Starlette 1.x would rather have httpx2; httpx is what is installed
    warnings.simplefilter("ignore", UserWarning)
    from starlette.testclient import TestClient

TOKEN = "test-token-7f3a"


@pytest.fixture
def driven(log: EventLog, tmp_path: Path) -> DrivenJob:
    """A cluster with one TaskManager and no job yet."""
    return DrivenJob(log, tmp_path)


@pytest.fixture
def finished(driven: DrivenJob) -> DrivenJob:
    """Job j1 run to its end: a failure, a restart, three attempts."""
    driven.all_the_way()
    return driven


@pytest.fixture
def client(log: EventLog) -> Iterator[Callable[..., TestClient]]:
    """``client(token=None)``: a TestClient of the dashboard over the test's prefix."""
    made: list[TestClient] = []

    def make(token: str | None = None) -> TestClient:
        c = TestClient(create_app(log, token=token), raise_server_exceptions=True)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


@pytest.fixture
def served(log: EventLog) -> Iterator[str]:
    """The dashboard (with the test token) served by uvicorn from a thread; its base URL."""
    server = UiServer(create_app(log, token=TOKEN), bind("127.0.0.1", 0))
    url = server.start()
    yield url
    server.stop()
