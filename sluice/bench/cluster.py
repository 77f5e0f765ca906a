"""A private cluster for benchmarks: redis-server, a JobManager and TaskManagers as processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from sluice.services.embedded import RedisServer
from sluice.store import EventLog, Keys, connect

__all__ = ["BenchCluster"]


class BenchCluster:
    def __init__(self, home: Path, prefix: str = "bench") -> None:
        self.home = home
        self.prefix = prefix
        self.redis = RedisServer(None)
        self.procs: list[subprocess.Popen] = []
        self.url = ""
        self._log: EventLog | None = None

    @property
    def log(self) -> EventLog:
        """The cluster's log (once the cluster is entered: ``with BenchCluster(...) as cluster``)."""
        if self._log is None:
            raise RuntimeError("the bench cluster is not started: use it in a with statement")
        return self._log

    def __enter__(self) -> BenchCluster:
        self.url = self.redis.start()
        self._log = EventLog(connect(self.url), Keys(self.prefix))
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        self.redis.stop()

    def spawn(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        self.home.mkdir(parents=True, exist_ok=True)
        log = open(self.home / f"proc-{len(self.procs)}.log", "wb")
        cmd = [sys.executable, "-m", "sluice", "--redis", self.url, "--prefix", self.prefix, "--home", str(self.home),
               *args]
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                             env={**os.environ, "SLUICE_LOG_LEVEL": "WARNING", **(env or {})})
        self.procs.append(p)
        return p

    def wait_registered(self, n: int, timeout: float = 60) -> None:
        from sluice.services.membership.core import Membership, evolve

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = Membership()
            for _, env in self.log.replay(self.log.keys.facts(self.log.keys.cluster)):
                evolve(state, env)
            if len(state.active()) >= n:
                return
            time.sleep(0.1)
        raise RuntimeError(f"{n} TaskManagers did not register within {timeout} s; see {self.home}")
