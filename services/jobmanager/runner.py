"""The JobManager as a real process: its main loop and the thread that renews its lease.

The JobManager is a step machine (services/jobmanager/process.py): nothing in a step
sleeps. Here the steps are driven: the main loop steps until told to stop, waits out Redis
outages (a standby's step may not touch Redis, so it asks the server itself before going
on), and waits a little between steps that did nothing while standing by; a thread renews
the lease every third of its time to live. The simulation drives the same steps in the
order its seed picks, without this module.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from sluice.errors import RedisUnavailable
from sluice.services.common.shell import RedisAway

__all__ = ["ProcessLoop"]


class ProcessLoop:
    """Built from small ports of the JobManager: ``step(block_ms)`` (whether it did
    anything), ``step_lease()``, ``ping()`` (ask the Redis server), ``block_ms()`` (how long
    a step may block now), ``standing_by()``, ``release()`` (hand leadership over when the
    loop ends), the lease's time to live, a logger and ``on_error(exc, what)``."""

    def __init__(
        self,
        *,
        step: Callable[[int | None], bool],
        step_lease: Callable[[], bool],
        ping: Callable[[], object],
        block_ms: Callable[[], int | None],
        standing_by: Callable[[], bool],
        release: Callable[[], None],
        ttl_ms: int,
        logger: Any,
        on_error: Callable[[BaseException, str], None],
    ) -> None:
        self.step, self.step_lease, self.ping, self.block_ms = step, step_lease, ping, block_ms
        self.standing_by, self.release, self.ttl_ms = standing_by, release, ttl_ms
        self.logger, self.on_error = logger, on_error

    def run(self, stop: threading.Event) -> None:
        """Stand by until leading, lead until deposed or stopped; survive Redis outages."""
        renewer = threading.Thread(target=self._renew_loop, args=(stop,), name="lease-renewal", daemon=True)
        renewer.start()
        away = RedisAway(self.logger)
        try:
            while not stop.is_set():
                try:
                    if away.since is not None:  # a standby's step may not touch Redis: ask it
                        self.ping()
                        away.back()
                    did = self.step(self.block_ms())
                except RedisUnavailable as exc:  # it stepped down: it rebuilds from the log when back
                    stop.wait(away.away(exc))
                    continue
                if not did and self.standing_by():
                    stop.wait(self.ttl_ms / 4000)
        finally:
            stop.set()
            renewer.join()
            self.release()

    def _renew_loop(self, stop: threading.Event) -> None:
        every = self.ttl_ms / 3000
        while not stop.wait(every):
            try:
                self.step_lease()
            except RedisUnavailable:
                continue  # the main loop sees it too; the lease may still be ours
            except Exception as exc:  # never let the renewal thread die silently
                self.on_error(exc, "lease renewal failed")
