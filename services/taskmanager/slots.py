"""Where a TaskManager's tasks run: one worker per slot, behind one small interface.

``ProcessSlots`` is what a real TaskManager uses: one RQ SimpleWorker process per slot
(supervised: a worker that dies is reported and replaced), tasks handed over through the
slot's RQ queue. The simulation passes its own ``Slots`` whose workers are actors of its
scheduler. The TaskManager never knows which.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from sluice.events import Envelope
from sluice.services.common.guard import guarded
from sluice.store import EventLog, connect
from sluice.store.acl import check_access
from sluice.store.slots import SlotQueues

__all__ = ["Slots", "ProcessSlots", "RQ_URL_ENV"]

RQ_URL_ENV = "SLUICE_RQ_REDIS_URL"
"""Where a slot's worker finds RQ's Redis when it is not the log's (sluice.config.Settings)."""


class Slots(Protocol):
    def start(self, slots: int) -> None:
        """Start one worker per slot."""

    def launch(
        self,
        slot: int,
        descriptor: dict[str, Any],
        runtime: dict[str, Any],
        *,
        task_id: str,
        handle: str,
        reports: Sequence[tuple[str, Envelope]] = (),
    ) -> str:
        """Hand a task to the slot's worker under ``handle`` (a fresh id); returns the handle.
        ``reports`` (stream, message) are appended, in order, before the worker can take the
        task, all or nothing with the hand-over, in one round trip. When it raises
        RedisUnavailable the outcome is unknown (the reply may be what was lost):
        ``handed_over(handle)`` tells, once Redis is back."""

    def handed_over(self, handle: str) -> bool:
        """Whether a launch under ``handle`` took effect."""

    def cancel_queued(self, handle: str) -> None:
        """Take a task that no worker has begun out of its queue."""

    def started(self, handle: str) -> bool:
        """Whether the slot's worker began the task."""

    def kill(self, slot: int, *, wait: bool = False) -> None:
        """Kill the slot's worker (what it ran dies with it); it is reported by ``exited``
        and replaced, unless ``wait``: then it is replaced at once and not reported."""

    def alive(self, slot: int) -> bool:
        """Whether the slot's worker runs."""

    def exited(self) -> list[tuple[int, str]]:
        """Workers that died since the last call, as (slot, how), each replaced."""

    def stop(self) -> None:
        """Stop every worker."""

    def sweep_sink(self, path: str, subtask: int, abandoned: int | None = None) -> None:
        """Delete the sink files of ``subtask``'s attempts older than its newest published
        one (what a killed stale attempt left halfway through publishing), and those of
        attempt ``abandoned`` (one the leader cancelled) if it never published."""


class ProcessSlots:
    """One ``sluice worker`` process per slot, fed through the slot's RQ queue."""

    def __init__(
        self,
        log: EventLog,
        resource_id: str,
        *,
        redis_url: str | None,
        home: Path,
        spark_remote: Any = None,
        rq_redis_url: str | None = None,
    ) -> None:
        self.log, self.resource_id, self.redis_url, self.home = log, resource_id, redis_url, home
        self.rq_redis_url = rq_redis_url if rq_redis_url != redis_url else None
        """The Redis of the slots' RQ queues when it is not the log's (None: the log's)."""
        rq = connect(self.rq_redis_url) if self.rq_redis_url else None
        if rq is not None and self.rq_redis_url is not None:
            check_access(rq, log.keys, self.rq_redis_url, log=False)
        self.queues = SlotQueues(log, resource_id, rq=rq)
        self.workers: dict[int, subprocess.Popen[bytes]] = {}
        self.spark_remote = spark_remote
        """A callable giving the Spark Connect URL for the workers' environment (or None)."""

    def start(self, slots: int) -> None:
        for slot in range(slots):
            self._spawn(slot)

    def _spawn(self, slot: int) -> None:
        if self.redis_url is None:
            raise RuntimeError("a TaskManager that executes tasks needs the Redis URL to start its workers")
        cmd = [
            sys.executable,
            "-m",
            "sluice",
            "--redis",
            self.redis_url,
            "--prefix",
            self.log.keys.prefix,
            "--home",
            str(self.home),
            *(("--rq-redis", self.rq_redis_url) if self.rq_redis_url else ()),
            "worker",
            "--resource-id",
            self.resource_id,
            "--slot",
            str(slot),
        ]
        logs = self.home / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        out = open(logs / f"{self.resource_id}-slot{slot}.log", "ab")
        remote = self.spark_remote() if callable(self.spark_remote) else None
        env = {**os.environ, "SLUICE_SPARK_REMOTE": remote} if remote else None
        if self.rq_redis_url:
            env = {**(env or os.environ), RQ_URL_ENV: self.rq_redis_url}
        self.workers[slot] = subprocess.Popen(
            guarded(cmd, signal.SIGKILL), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
        out.close()

    def launch(
        self,
        slot: int,
        descriptor: dict[str, Any],
        runtime: dict[str, Any],
        *,
        task_id: str,
        handle: str,
        reports: Sequence[tuple[str, Envelope]] = (),
    ) -> str:
        from .worker import RUN_TASK

        return self.queues.enqueue(
            slot, RUN_TASK, (descriptor, runtime), job_id=handle, description=task_id, before=reports
        )

    def handed_over(self, handle: str) -> bool:
        return self.queues.exists(handle)

    def cancel_queued(self, handle: str) -> None:
        self.queues.cancel(handle)

    def started(self, handle: str) -> bool:
        return self.queues.started(handle)

    def alive(self, slot: int) -> bool:
        proc = self.workers.get(slot)
        return proc is not None and proc.poll() is None

    def kill(self, slot: int, *, wait: bool = False) -> None:
        proc = self.workers.get(slot)
        if proc is None or proc.poll() is not None:
            return
        proc.kill()
        if wait:
            proc.wait()
            self._spawn(slot)

    def exited(self) -> list[tuple[int, str]]:
        out = []
        for slot, proc in list(self.workers.items()):
            code = proc.poll()
            if code is None:
                continue
            out.append((slot, f"signal {-code}" if code < 0 else f"exit code {code}"))
            self._spawn(slot)
        return out

    def stop(self) -> None:
        for proc in self.workers.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.workers.values():
            try:
                proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.workers.clear()

    def sweep_sink(self, path: str, subtask: int, abandoned: int | None = None) -> None:
        from sluice.services.dataplane.exchange import sweep_sink

        sweep_sink(path, subtask, abandoned)
