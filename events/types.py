"""Small value types shared by the event catalogue: states, ranges, limits."""

from __future__ import annotations

import enum

from .schema import record

__all__ = ["TaskState", "JobStatus", "KeyGroupRange", "PROTOCOL_VERSION", "DEFAULT_MAX_PARALLELISM"]

PROTOCOL_VERSION = 1
"""Bumped when TaskManagers and JobManagers of different versions can no longer talk."""

DEFAULT_MAX_PARALLELISM = 128
"""Number of key groups a keyed exchange hashes keys into (Flink's default)."""


class TaskState(str, enum.Enum):
    """States of one execution attempt of a subtask, as Flink names them."""

    CREATED = "CREATED"
    SCHEDULED = "SCHEDULED"
    DEPLOYING = "DEPLOYING"
    INITIALIZING = "INITIALIZING"
    RUNNING = "RUNNING"
    FINISHED = "FINISHED"
    CANCELING = "CANCELING"
    CANCELED = "CANCELED"
    FAILED = "FAILED"

    # str's own hash (in C), which agrees with the str equality members compare by, where
    # Enum's is a Python call: states are hashed in the hot path of every replay.
    __hash__ = str.__hash__

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL_TASK


_TERMINAL_TASK = frozenset({TaskState.FINISHED, TaskState.CANCELED, TaskState.FAILED})


class JobStatus(str, enum.Enum):
    CREATED = "CREATED"
    RUNNING = "RUNNING"
    FAILING = "FAILING"
    FAILED = "FAILED"
    CANCELLING = "CANCELLING"
    CANCELED = "CANCELED"
    FINISHED = "FINISHED"

    __hash__ = str.__hash__  # (as TaskState's)


@record
class KeyGroupRange:
    """Key groups ``start..end``, both inclusive, as Flink's KeyGroupRange."""

    start: int
    end: int
