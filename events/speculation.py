"""Speculative execution (Flink's SpeculativeScheduler, FLIP-168): facts of a job's stream.

``SpeculativeAttemptScheduled``: a subtask whose current attempt runs well past its vertex's
median gets a second, concurrent attempt (placed on another TaskManager). ``AttemptWon``:
the first of a subtask's concurrent attempts to finish (or to complete its partition) wins;
it is the subtask's current attempt from then on, and the others are cancelled.
"""

from __future__ import annotations

from .schema import Event, event

__all__ = ["SpeculativeAttemptScheduled", "AttemptWon"]


@event("SpeculativeAttemptScheduled")
class SpeculativeAttemptScheduled(Event):
    """Subtask ``subtask`` of ``vertex_id`` gets attempt ``attempt``, concurrent with its
    current attempt ``original`` (which ran ``elapsed_ms``, past ``baseline_ms``); it may
    not run on ``avoid`` (the TaskManager the original runs on)."""

    job_id: str
    vertex_id: str
    subtask: int
    attempt: int
    original: int
    elapsed_ms: int
    baseline_ms: int
    avoid: str | None = None


@event("AttemptWon")
class AttemptWon(Event):
    """Attempt ``attempt`` of subtask ``subtask`` of ``vertex_id`` won over its concurrent
    attempts ``losers``: it is the subtask's current attempt from now on (consumers read only
    its output), and the losers are cancelled. No losers: the current attempt failed, and
    this one, which ran beside it, carries on in its place."""

    job_id: str
    vertex_id: str
    subtask: int
    attempt: int
    losers: list[int]
