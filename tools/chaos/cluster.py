"""One run's cluster of real processes: redis-server, the projector, two JobManagers (one
leads, one stands by), TaskManagers with one RQ worker per slot; every pid it ever ran,
so the run can prove none is left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from sluice.errors import RedisUnavailable, SluiceError
from sluice.events import LeadershipGranted
from sluice.services.embedded import EmbeddedCluster
from sluice.services.embedded.redis_server import RedisServer
from sluice.services.membership.core import Membership
from sluice.services.membership.core import evolve as membership_evolve
from sluice.store import EventLog, Keys, LeaseHolder, connect, current_leader

from . import procs
from .procs import Ident

__all__ = ["Timing", "ChaosCluster", "poll"]

T = TypeVar("T")


@dataclass(frozen=True)
class Timing:
    """Short timeouts, so that a fault is noticed (and recovered from) in seconds."""

    heartbeat_interval_ms: int = 250
    heartbeat_timeout_ms: int = 4000
    lease_ttl_ms: int = 3000

    def env(self) -> dict[str, str]:
        return {
            "SLUICE_HEARTBEAT_INTERVAL_MS": str(self.heartbeat_interval_ms),
            "SLUICE_HEARTBEAT_TIMEOUT_MS": str(self.heartbeat_timeout_ms),
            "SLUICE_LEASE_TTL_MS": str(self.lease_ttl_ms),
        }


def poll(
    check: Callable[[], T | None], timeout: float, every: float = 0.1, tick: Callable[[], None] | None = None
) -> T | None:
    """``check()`` until it returns something truthy (returned) or ``timeout`` passes (None).
    Redis being away counts as "not yet"."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except (RedisUnavailable, ConnectionError):
            value = None
        if value:
            return value
        if tick is not None:
            tick()
        if time.monotonic() > deadline:
            return None
        time.sleep(every)


@dataclass
class Proc:
    role: str
    name: str
    pid: int


@dataclass
class ChaosCluster:
    home: Path
    prefix: str
    fsync: str
    spark: str
    timing: Timing = Timing()
    slots: int = 2
    procs: dict[str, Proc] = field(default_factory=dict)
    """Every Sluice process started, by name (the dead ones stay: the leak check wants them)."""
    seen: set[Ident] = field(default_factory=set)
    """Every process the run started or saw as one of its workers, redis-servers included
    (by pid and start time: a pid reused by someone else's process is never touched)."""
    retired: set[str] = field(default_factory=set)
    """Names of processes killed on purpose."""
    redis_pid: int = 0
    port: int = 0
    url: str = ""
    _count: dict[str, int] = field(default_factory=dict)
    _redis: list[RedisServer] = field(default_factory=list)

    # --- start ---------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        return {**self.timing.env(), "SLUICE_SPARK_REMOTE": self.spark, "SLUICE_REDIS_APPENDFSYNC": self.fsync}

    @property
    def embedded(self) -> EmbeddedCluster:
        return EmbeddedCluster(self.home, prefix=self.prefix, env=self.env())

    def start(self, taskmanagers: int = 2) -> None:
        embedded = self.embedded
        self.url = embedded.redis_url(detach=True)
        rec = json.loads((self.home / "cluster.json").read_text())["redis"]  # what the supervisor started
        self.redis_pid, self.port = int(rec["pid"]), int(rec["port"])
        self._see(self.redis_pid)
        self.log = EventLog(connect(self.url), Keys(self.prefix))
        self.spawn("projector")
        self.spawn("jobmanager")
        self.spawn("jobmanager")
        for _ in range(taskmanagers):
            self.spawn("taskmanager")
        if not poll(lambda: self.leading() is not None and len(self.registered()) >= taskmanagers, 60):
            raise SluiceError(f"the chaos cluster in {self.home} did not come up within 60 s (see {self.home}/logs)")

    def spawn(self, role: str) -> Proc:
        short = {"jobmanager": "jm", "taskmanager": "tm"}.get(role, role)
        n = self._count[short] = self._count.get(short, 0) + 1
        name = f"{short}-{n}"
        args: tuple[str, ...] = ()
        if role == "jobmanager":
            args = ("--id", name)
        elif role == "taskmanager":
            args = ("--slots", str(self.slots))
        info = self.embedded.spawn(role, self.url, *args, name=name)
        p = self.procs[name] = Proc(role, name, info.pid)
        self._see(info.pid)
        return p

    # --- what runs -----------------------------------------------------------------------

    def live(self, role: str) -> list[Proc]:
        return [p for n, p in sorted(self.procs.items()) if p.role == role and procs.alive(p.pid)]

    def log_file(self, name: str) -> Path:
        return self.home / "logs" / f"{name}.log"

    def membership(self) -> Membership:
        state = Membership()
        for _, env in self.log.replay(self.log.keys.facts(self.log.keys.cluster)):
            membership_evolve(state, env)
        return state

    def registered(self) -> set[str]:
        return {r.resource_id for r in self.membership().active()}

    def grants(self) -> list[tuple[str, LeadershipGranted]]:
        return [
            (i, env.event)
            for i, env in self.log.replay(self.log.keys.facts(self.log.keys.cluster))
            if isinstance(env.event, LeadershipGranted)
        ]

    def leading(self) -> LeaseHolder | None:
        """The lease holder, once it has committed its LeadershipGranted (it leads, not replays)."""
        holder = current_leader(self.log)
        if holder is None or holder.holder not in self.procs:
            return None
        if not any(g.epoch == holder.epoch for _, g in self.grants()):
            return None
        return holder

    def died(self) -> list[str]:
        """Processes that ended though nobody killed them (a service must outlive any fault),
        each with the last line of its log."""
        out = []
        for name, p in sorted(self.procs.items()):
            if name in self.retired or procs.alive(p.pid):
                continue
            try:
                last = self.log_file(name).read_text(errors="replace").strip().splitlines()[-1]
            except (OSError, IndexError):
                last = "(no log)"
            out.append(f"{p.role} {name} (pid {p.pid}) exited on its own; its log ends: {last[:300]}")
        return out

    def _see(self, *pids: int) -> None:
        for pid in pids:
            who = procs.ident(pid)
            if who is not None:
                self.seen.add(who)

    def sample_workers(self) -> None:
        """Remember every worker process seen (they come and go with the TaskManagers)."""
        for tm in self.live("taskmanager"):
            self._see(*procs.workers_of(tm.pid))

    def full_strength(self, taskmanagers: int) -> bool:
        """Two JobManagers alive, one leading, and ``taskmanagers`` live ones registered."""
        if len(self.live("jobmanager")) < 2 or self.leading() is None:
            return False
        live = {p.name for p in self.live("taskmanager")}
        return len(live & self.registered()) >= taskmanagers

    # --- redis ---------------------------------------------------------------------------

    def kill_redis(self) -> None:
        procs.kill(self.redis_pid)
        procs.wait_gone([self.redis_pid], 10)

    def restart_redis(self) -> None:
        """On the same port and data directory (the AOF), with the same fsync policy."""
        server = RedisServer(self.home / "redis", port=self.port, fsync=self.fsync)
        deadline = time.monotonic() + 20
        while True:
            try:
                server.start(detach=True, timeout=20)
                break
            except RedisUnavailable:  # the port may linger for a moment
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        self._redis.append(server)
        self.redis_pid = int(server.pid or 0)
        self._see(self.redis_pid)

    # --- stop ----------------------------------------------------------------------------

    def stop(self) -> tuple[int, str]:
        """``sluice cluster stop`` on this cluster's home (what a user runs); its exit code and output."""
        for who in self.seen:
            if procs.same(who):
                procs.kill(who[0], 18)  # SIGCONT: a frozen process could not stop
        cmd = [sys.executable, "-m", "sluice", "--home", str(self.home), "--prefix", self.prefix, "cluster", "stop"]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, **self.env()})
            return done.returncode, (done.stdout + done.stderr)[-2000:]
        except subprocess.TimeoutExpired as exc:
            return -1, f"`sluice cluster stop` did not end within 120 s: {exc}"

    def leftovers(self) -> list[str]:
        """What still runs of this cluster: pids it started or saw, processes naming its
        prefix or home, a server on its Redis port."""
        left = self._running()
        out = []
        for pid in sorted(left):
            out.append(f"pid {pid}: {' '.join(procs.argv(pid))[:160]}")
        return out

    def _running(self) -> set[int]:
        ours = {who[0] for who in self.seen if procs.same(who)}
        ours |= set(procs.find(lambda a: procs.option(a, "--prefix") == self.prefix))
        ours |= set(procs.find(lambda a: procs.option(a, "--home") == str(self.home)))
        ours |= set(
            procs.find(
                lambda a: (
                    a[0].startswith("redis-server")
                    and (procs.option(a, "--port") == str(self.port) or f"127.0.0.1:{self.port}" in " ".join(a).split())
                )
            )
        )
        return ours

    def force_stop(self) -> None:
        """Kill whatever is left (after the leak check recorded it), so the campaign goes on clean."""
        left = self._running()
        for pid in left:
            procs.kill(pid, 18)
            procs.kill(pid)
        procs.wait_gone(sorted(left), 10)

    def temp_files(self) -> dict[str, list[str]]:
        """Files left in each TaskManager's temp directory (``<home>/tmp/<resource id>``)."""
        out = {}
        root = self.home / "tmp"
        if root.is_dir():
            for d in sorted(root.iterdir()):
                files = sorted(str(p.relative_to(root)) for p in d.rglob("*"))
                if files:
                    out[d.name] = files
        return out
