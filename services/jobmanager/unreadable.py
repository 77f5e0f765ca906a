"""A log the JobManager cannot read: hand the lease over, back off, say so once.

A fact that this JobManager's replay cannot decode (``DecodeError``: a newer schema version
or event type, written by a later Sluice; or bytes no Sluice wrote) means it cannot rebuild
the state it would lead with. Retrying at once cannot help (the fact stays: facts are never
trimmed), and holding the lease keeps out a JobManager that can read it. So it releases the
lease (never having committed, when the fact is met before it serves), and waits, longer
each time, before it tries again; before it takes the lease again, it looks whether the
entry it could not read is still there (``still_there``), so a JobManager of an older
version beside a newer one never takes the lease from the newer one's log again. It says
what it met once, as one error line naming the stream, the entry, why and what to do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sluice.errors import DecodeError, UnknownEventType, UnsupportedSchemaVersion
from sluice.store import EventLog

__all__ = ["Unreadable", "UnreadableWatch", "advice", "MAX_BACKOFF_S"]

MAX_BACKOFF_S = 60.0
"""The longest a JobManager that cannot read the log waits before it looks again."""


def advice(exc: DecodeError) -> str:
    """What a person should do about ``exc``, met replaying a fact stream."""
    where = f"`sluice inspect tail {exc.stream}`" if exc.stream else "`sluice inspect tail`"
    if isinstance(exc, UnsupportedSchemaVersion) and exc.newer:
        return (
            f"schema version {exc.version} of {exc.type_name} is newer than this JobManager knows "
            f"({exc.current}): a later Sluice wrote it. Upgrade this JobManager, or roll the cluster forward "
            "(a JobManager that reads it leads meanwhile; this one stands by)"
        )
    if isinstance(exc, UnknownEventType):
        return (
            "a later Sluice wrote an event type this JobManager does not know: upgrade this JobManager (a "
            f"JobManager that reads it leads meanwhile). If no Sluice wrote it, look at it with {where}"
        )
    return (
        "no Sluice can read this entry (facts are written only by the leader's commits: something else wrote "
        f"it, or it is corrupted), so no JobManager leads until it is dealt with. Look at it with {where}, then "
        "restore the log from a backup, or delete the entry (XDEL) if its fact can be lost"
    )


@dataclass
class Unreadable:
    """The fact this JobManager could not read, and when it looks again."""

    stream: str | None
    entry_id: str | None
    reason: str
    backoff_s: float
    retry_at: float
    """On the JobManager's monotonic clock."""

    def same(self, exc: DecodeError) -> bool:
        return (self.stream, self.entry_id) == (exc.stream, exc.entry_id)

    def again(self, now: float, max_s: float = MAX_BACKOFF_S) -> None:
        """Still unreadable: wait twice as long (at most ``max_s``) before looking again."""
        self.backoff_s = min(self.backoff_s * 2, max_s)
        self.retry_at = now + self.backoff_s

    def still_there(self, log: EventLog) -> bool | None:
        """Whether the entry is still in its stream and this JobManager still cannot read it
        (None when the error did not say where: only a replay can tell)."""
        if self.stream is None or self.entry_id is None:
            return None
        fields = log.entry(self.stream, self.entry_id)
        if fields is None:
            return False
        raw = fields.get(b"e")
        if raw is None or len(fields) != 1:
            return True
        try:
            log.decode(raw)
        except DecodeError:
            return True
        return False


class UnreadableWatch:
    """The fact this JobManager last could not read (``current``; None: none met), said once
    per entry, and whether it may try to lead again. Built from the log, a logger and the
    JobManager's monotonic clock (seconds)."""

    def __init__(self, log: EventLog, logger: Any, monotonic: Callable[[], float]) -> None:
        self.log, self.logger, self.monotonic = log, logger, monotonic
        self.current: Unreadable | None = None

    def met(self, exc: DecodeError, wait_s: float, *, epoch: int | None, served: bool) -> None:
        """``exc`` was met (the JobManager has stepped down and handed the lease over): wait
        ``wait_s`` before looking again, longer each time the same entry is met."""
        now = self.monotonic()
        if self.current is not None and self.current.same(exc):
            self.current.again(now)
            self.logger.debug(
                "still cannot read the log", stream=exc.stream, entry=exc.entry_id, retry_in_s=self.current.backoff_s
            )
            return
        self.current = Unreadable(exc.stream, exc.entry_id, exc.reason, wait_s, now + wait_s)
        self.logger.error(
            "cannot read the log it would lead: lease released",
            stream=exc.stream,
            entry=exc.entry_id,
            epoch=epoch,
            served=served,
            error=f"{exc.kind}: {exc.reason}"[:500],
            what_to_do=advice(exc),
        )

    def may_lead(self) -> bool:
        """Whether to try to lead now: not before the wait is over, and not while the fact met
        is still there (looked at without taking the lease)."""
        u = self.current
        if u is None:
            return True
        now = self.monotonic()
        if now < u.retry_at:
            return False
        there = u.still_there(self.log)
        if there:
            u.again(now)
            return False
        if there is False:
            self.logger.info(
                "the fact this JobManager could not read is gone or readable: it may lead again",
                stream=u.stream,
                entry=u.entry_id,
            )
            self.current = None
        return True
