"""Running real Sluice processes against the test Redis, and waiting on what the log says."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import pytest

from sluice.events import Envelope
from sluice.services.membership.core import Membership, evolve
from sluice.store import EventLog

T = TypeVar("T")

FAST = {
    "SLUICE_HEARTBEAT_INTERVAL_MS": "100",
    "SLUICE_HEARTBEAT_TIMEOUT_MS": "800",
    "SLUICE_LEASE_TTL_MS": "800",
}


def wait_until(check: Callable[[], T], what: str, timeout: float = 20.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def facts(log: EventLog) -> list[Envelope]:
    return [e for _, e in log.replay(log.keys.facts(log.keys.cluster))]


def membership(log: EventLog) -> Membership:
    state = Membership()
    for e in facts(log):
        evolve(state, e)
    return state


def registered(log: EventLog) -> set[str]:
    return {r.resource_id for r in membership(log).active()}


class Processes:
    """Sluice processes of one test, each logging to its own file, all killed at teardown."""

    def __init__(self, url: str, prefix: str, logs: Path) -> None:
        self.url, self.prefix, self.logs = url, prefix, logs
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, role: str, *args: str, url: str | None = None, env: dict | None = None) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "sluice", "--redis", url or self.url, "--prefix", self.prefix, role, *args]
        out = open(self.logs / f"{name}.log", "wb")
        from sluice.services.common.guard import guarded

        proc = subprocess.Popen(guarded(cmd), stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **FAST, **(env or {})})
        out.close()
        self.procs[name] = proc
        return proc

    def output(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def signal(self, name: str, sig: int) -> None:
        self.procs[name].send_signal(sig)

    def stop_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGCONT)
                    p.kill()
                except ProcessLookupError:
                    pass
            p.wait(timeout=10)


@pytest.fixture
def procs(redis_url: str, prefix: str, tmp_path: Path) -> Iterator[Processes]:
    p = Processes(redis_url, prefix, tmp_path)
    yield p
    p.stop_all()
    for name in p.procs:  # shown by pytest only when the test failed
        print(f"----- {name} (last lines) -----")
        print("\n".join(p.output(name).splitlines()[-25:]))
