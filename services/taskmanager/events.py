"""A running subtask's side of the coordination protocol: it asks its source coordinator
for splits and exchanges operator events with its operator's coordinator.

Everything for one subtask arrives in its own inbox (``Keys.task_inbox``), written by the
leader in the commit that decided it; every entry names the attempt it is meant for, and
an attempt reads only its own (events sent while it was not running wait there for it;
events for an earlier attempt are skipped). What it sends goes to the job's inbox. The
reader waits through a JobManager failover: the new leader answers what the old one had
not.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, cast

from sluice.errors import NoAnswer, RedisUnavailable, ServiceError, WrongType
from sluice.events import (
    JSON,
    Envelope,
    NextInputSplit,
    OperatorEvent,
    RequestNextInputSplit,
    TaskDeploymentDescriptor,
    decode_fields,
)
from sluice.services.common.world import SYSTEM, World
from sluice.services.coordination.source import NO_MORE, REQUEST, SPLIT
from sluice.store import EventLog
from sluice.store.connection import Outage

__all__ = ["TaskEvents", "NoAnswer", "current", "install"]


class TaskEvents:
    def __init__(
        self,
        log: EventLog,
        descriptor: TaskDeploymentDescriptor,
        host: str,
        *,
        answer_timeout_s: float = 600.0,
        world: World = SYSTEM,
        blocking: bool = True,
        outage: Outage | None = None,
    ) -> None:
        """``blocking``: the real worker's mode, where a send that fails because Redis is away
        is tried again (the same message) until it gets through; the simulation's steps
        take ``blocking=False`` and call ``resend()`` themselves. ``outage``: how a blocking
        attempt waits for Redis when it is away (as long as its TaskManager lives; the time
        spent waiting does not count against ``answer_timeout_s``); without one, sends are
        retried for at most ``answer_timeout_s`` and a failed read raises."""
        d = descriptor
        self.log, self.host, self.world, self.blocking = log, host, world, blocking
        self.outage = outage if blocking else None
        self._seq = 0
        self.unsent: Envelope | None = None
        """A message whose sending failed: it may or may not be in the inbox, so it is sent
        again as it is (same seq: the leader takes it once)."""
        self.job_id, self.vertex, self.subtask, self.attempt = d.job_id, d.vertex, d.subtask, d.attempt
        self.execution_id = d.execution_id
        self.protocol = d.source.protocol if d.source is not None else "operator-events"
        self.is_source = d.kind == "source"
        keys = log.keys
        tag = keys.job(self.job_id)
        self.job_inbox = keys.inbox(tag)
        self.inbox = keys.task_inbox(tag, self.vertex, self.subtask)
        self.position = "0-0"
        self.answer_timeout_s = answer_timeout_s
        self._events: deque[Any] = deque()  # operator events for the user's code
        self._splits: deque[dict[str, Any] | None] = deque()

    # --- splits: the steps (the simulation drives them one at a time) ---
    def ask_for_split(self) -> None:
        """Ask the coordinator for this subtask's next split (the answer comes to the inbox)."""
        seq = self._next_seq()
        if self.protocol == "input-splits":
            msg: RequestNextInputSplit | OperatorEvent = RequestNextInputSplit(
                self.job_id, self.vertex, self.subtask, self.execution_id, self.host, seq
            )
        else:
            msg = OperatorEvent(
                self.job_id,
                self.vertex,
                self.subtask,
                True,
                JSON({"type": REQUEST, "host": self.host}),
                self.attempt,
                seq,
            )
        self._send(msg)

    def answered(self) -> bool:
        """Whether an answer to a split request is here (read the inbox with ``poll``)."""
        return bool(self._splits)

    def take_split(self) -> dict[str, Any] | None:
        """The answer that came (None: no more splits)."""
        return self._splits.popleft()

    def poll(self) -> None:
        """Read what arrived in this subtask's inbox, without waiting."""
        self._poll(0.0)

    # --- splits: blocking ---
    def next_split(self) -> dict[str, Any] | None:
        """The next split for this subtask (None: no more). Blocks until the coordinator answers."""
        self.ask_for_split()
        deadline = time.monotonic() + self.answer_timeout_s
        while not self._splits:
            left = deadline - time.monotonic()
            if left <= 0:
                raise NoAnswer(
                    f"{self.execution_id} asked for a split and got no answer in "
                    f"{self.answer_timeout_s:.0f} s: is a JobManager running?"
                )
            deadline += self._poll(min(left, 1.0))
        return self._splits.popleft()

    # --- operator events ---
    def send_to_coordinator(self, body: Any) -> None:
        self._send(OperatorEvent(self.job_id, self.vertex, self.subtask, True, body, self.attempt, self._next_seq()))

    def next_event(self, timeout_s: float = 0.0) -> Any | None:
        """The next operator event from the coordinator for this attempt (None: none came in time)."""
        deadline = time.monotonic() + timeout_s
        while not self._events:
            left = deadline - time.monotonic()
            if left <= 0:
                self._poll(0.0)
                break
            self._poll(left)
        return self._events.popleft() if self._events else None

    # --- plumbing ---
    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _send(self, msg: Any) -> None:
        if self.unsent is not None:
            raise ServiceError(f"{self.execution_id} has a message that did not get through: resend() it first")
        self.unsent = Envelope(msg, self.world.new_id(), 0, self.world.now_ms(), self.job_id)
        self.resend()

    def resend(self) -> None:
        """Send again the message that did not get through (if any). An inbox that refuses
        it (its key holds another kind of value again right after it was moved aside) is
        tried again until the answer timeout."""
        unsent = self.unsent
        if unsent is None:
            return
        delay = 0.05
        deadline = time.monotonic() + self.answer_timeout_s
        while True:
            try:
                self.log.append(self.job_inbox, unsent)
                self.unsent = None
                return
            except (RedisUnavailable, WrongType) as exc:
                if isinstance(exc, RedisUnavailable) and self.outage is not None:
                    self.outage.wait(exc)  # raises only when this worker's TaskManager is gone
                    continue
                if not self.blocking or time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _poll(self, block_s: float) -> float:
        """Read the inbox; returns the seconds spent waiting for Redis to come back (0.0
        unless it was away and this attempt waits through outages)."""
        try:
            entries = self.log.follow(
                {self.inbox: self.position}, block_ms=max(int(block_s * 1000), 1) if block_s else None, count=100
            )
        except RedisUnavailable as exc:
            if self.outage is None:
                raise
            return self.outage.wait(exc)
        except WrongType:  # the inbox's key holds another kind of value: moved aside (what was unread is lost)
            self.log.set_aside([self.inbox])
            return 0.0
        for _, entry_id, fields in entries:
            self.position = entry_id
            ev = decode_fields(fields, stream=self.inbox, entry_id=entry_id).event
            if isinstance(ev, NextInputSplit):
                if ev.execution_id == self.execution_id:
                    self._splits.append(cast("dict[str, Any] | None", ev.split))  # a split is a JSON object
            elif isinstance(ev, OperatorEvent) and ev.attempt == self.attempt and not ev.to_coordinator:
                body = ev.body
                if self.is_source and isinstance(body, dict) and body.get("type") in (SPLIT, NO_MORE):
                    self._splits.append(body.get("split"))
                else:
                    self._events.append(body)
        return 0.0


_current: TaskEvents | None = None


def install(events: TaskEvents | None) -> None:
    global _current
    _current = events


def current() -> TaskEvents:
    if _current is None:
        raise ServiceError(
            "no task is running in this process: task_context() works inside a transform of a running Sluice task"
        )
    return _current
