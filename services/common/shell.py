"""What every shell needs and the cores must not have: ids, the clock, logging, signals."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Protocol

import structlog

__all__ = [
    "new_id",
    "now_ms",
    "hostname",
    "configure_logging",
    "stop_on_signals",
    "get_logger",
    "RedisAway",
    "set_aside_reporter",
]


def new_id() -> str:
    """128 random bits as 32 hex digits (a uuid4's entropy, at a third of its cost: ids are
    made for every event on the hot path)."""
    return os.urandom(16).hex()


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def hostname() -> str:
    return os.environ.get("SLUICE_HOST") or socket.gethostname()


def configure_logging(level: str | None = None, *, json: bool | None = None) -> None:
    """structlog to stderr: readable lines on a terminal, JSON lines otherwise (or SLUICE_LOG_JSON=1)."""
    level = (level or os.environ.get("SLUICE_LOG_LEVEL") or "INFO").upper()
    if json is None:
        json = os.environ.get("SLUICE_LOG_JSON") == "1"
    # Plain tracebacks, never rich's with every frame's locals: a log line is for a person,
    # and locals can hold secrets and whole messages.
    renderer = (
        structlog.processors.JSONRenderer()
        if json
        else structlog.dev.ConsoleRenderer(
            colors=sys.stderr.isatty(), exception_formatter=structlog.dev.plain_traceback
        )
    )
    processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso"),
    ]
    if json:
        processors.append(structlog.processors.format_exc_info)
    structlog.configure(
        processors=[
            *processors,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def get_logger(component: str, **bound: object) -> structlog.typing.FilteringBoundLogger:
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger().bind(component=component, **bound)
    return logger


class CountsParked(Protocol):
    """What ``set_aside_reporter`` needs of a process's metrics (``metrics.Metrics`` has it):
    this module stays below metrics.py, which imports ``hostname`` from here."""

    def parked(self, kind: str) -> None: ...


def set_aside_reporter(
    logger: structlog.typing.FilteringBoundLogger, metrics: CountsParked
) -> Callable[[str, str, str], None]:
    """A process's ``EventLog.on_set_aside``: an inbox it read or wrote to held another kind
    of value (something else wrote its key), which was moved aside. Messages unread in it
    were lost with it: the TaskManagers' slot reports bring back the final states of tasks."""

    def told(stream: str, kind: str, aside: str) -> None:
        metrics.parked("not-a-stream")
        logger.error(
            "an inbox held another kind of value; it was moved aside", stream=stream, held=kind, moved_to=aside
        )

    return told


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT, so a shell can leave gracefully."""
    stop = threading.Event()

    def handler(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


class RedisAway:
    """A service loop's view of Redis outages: one warning when Redis goes away and one line
    when it is back (with how long it was gone), never one per retry; and the wait before
    the next try, growing from 0.1 s to at most ``max_s`` (short, so heartbeats flow again
    soon after Redis returns and nobody is timed out for the outage)."""

    def __init__(self, logger: structlog.typing.FilteringBoundLogger, *, max_s: float = 1.0) -> None:
        self.logger, self.max_s = logger, max_s
        self.since: float | None = None
        self.delay = 0.1

    def away(self, error: BaseException) -> float:
        """A step met an outage; the seconds to wait before the next try."""
        import time

        if self.since is None:
            self.since = time.monotonic()
            self.delay = 0.1
            self.logger.warning(
                "Redis is away; waiting for it (nothing is lost: work in hand is kept and reported when it is back)",
                error=str(error)[:300],
            )
        else:
            self.delay = min(self.delay * 2, self.max_s)
        return self.delay

    def back(self) -> None:
        """A step got through."""
        if self.since is not None:
            import time

            self.logger.warning("Redis is back", after_s=round(time.monotonic() - self.since, 1))
            self.since = None
