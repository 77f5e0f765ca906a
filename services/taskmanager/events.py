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
from typing import Any

from sluice.errors import ServiceError
from sluice.events import Envelope, NextInputSplit, OperatorEvent, RequestNextInputSplit, decode_fields
from sluice.services.common.world import SYSTEM, World
from sluice.services.coordination.source import NO_MORE, REQUEST, SPLIT
from sluice.store import EventLog

__all__ = ["TaskEvents", "NoAnswer", "current", "install"]



class NoAnswer(ServiceError):
    """The coordinator did not answer in time (no JobManager leads?)."""


class TaskEvents:
    def __init__(self, log: EventLog, descriptor: dict, host: str, *, answer_timeout_s: float = 600.0,
                 world: World = SYSTEM) -> None:
        d = descriptor
        self.log, self.host, self.world = log, host, world
        self.job_id, self.vertex, self.subtask, self.attempt = d["job_id"], d["vertex"], d["subtask"], d["attempt"]
        self.execution_id = d["execution_id"]
        self.protocol = (d.get("source") or {}).get("protocol", "operator-events")
        self.is_source = d.get("kind") == "source"
        keys = log.keys
        tag = keys.job(self.job_id)
        self.job_inbox = keys.inbox(tag)
        self.inbox = keys.task_inbox(tag, self.vertex, self.subtask)
        self.position = "0-0"
        self.answer_timeout_s = answer_timeout_s
        self._events: deque[Any] = deque()  # operator events for the user's code
        self._splits: deque[dict | None] = deque()

    # --- splits: the steps (the simulation drives them one at a time) ---
    def ask_for_split(self) -> None:
        """Ask the coordinator for this subtask's next split (the answer comes to the inbox)."""
        if self.protocol == "input-splits":
            msg: Any = RequestNextInputSplit(self.job_id, self.vertex, self.subtask, self.execution_id, self.host)
        else:
            msg = OperatorEvent(self.job_id, self.vertex, self.subtask, True, {"type": REQUEST, "host": self.host},
                                self.attempt)
        self._send(msg)

    def answered(self) -> bool:
        """Whether an answer to a split request is here (read the inbox with ``poll``)."""
        return bool(self._splits)

    def take_split(self) -> dict | None:
        """The answer that came (None: no more splits)."""
        return self._splits.popleft()

    def poll(self) -> None:
        """Read what arrived in this subtask's inbox, without waiting."""
        self._poll(0.0)

    # --- splits: blocking ---
    def next_split(self) -> dict | None:
        """The next split for this subtask (None: no more). Blocks until the coordinator answers."""
        self.ask_for_split()
        deadline = time.monotonic() + self.answer_timeout_s
        while not self._splits:
            left = deadline - time.monotonic()
            if left <= 0:
                raise NoAnswer(f"{self.execution_id} asked for a split and got no answer in "
                               f"{self.answer_timeout_s:.0f} s: is a JobManager running?")
            self._poll(min(left, 1.0))
        return self._splits.popleft()

    # --- operator events ---
    def send_to_coordinator(self, body: Any) -> None:
        self._send(OperatorEvent(self.job_id, self.vertex, self.subtask, True, body, self.attempt))

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
    def _send(self, msg: Any) -> None:
        self.log.append(self.job_inbox, Envelope(msg, self.world.new_id(), 0, self.world.now_ms(), self.job_id))

    def _poll(self, block_s: float) -> None:
        entries = self.log.follow({self.inbox: self.position}, block_ms=max(int(block_s * 1000), 1) if block_s else None,
                                  count=100)
        for _, entry_id, fields in entries:
            self.position = entry_id
            ev = decode_fields(fields, stream=self.inbox, entry_id=entry_id).event
            if isinstance(ev, NextInputSplit):
                if ev.execution_id == self.execution_id:
                    self._splits.append(ev.split)
            elif isinstance(ev, OperatorEvent) and ev.attempt == self.attempt and not ev.to_coordinator:
                body = ev.body
                if self.is_source and isinstance(body, dict) and body.get("type") in (SPLIT, NO_MORE):
                    self._splits.append(body.get("split"))
                else:
                    self._events.append(body)


_current: TaskEvents | None = None


def install(events: TaskEvents | None) -> None:
    global _current
    _current = events


def current() -> TaskEvents:
    if _current is None:
        raise ServiceError("no task is running in this process: task_context() works inside a transform of a "
                           "running Sluice task")
    return _current
