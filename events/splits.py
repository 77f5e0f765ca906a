"""Input splits, operator coordinators and their events."""

from __future__ import annotations

from .schema import JSON, Event, event

__all__ = ["RequestNextInputSplit", "NextInputSplit", "OperatorEvent"]


@event("RequestNextInputSplit")
class RequestNextInputSplit(Event):
    job_id: str
    vertex_id: str
    subtask: int
    execution_id: str
    host: str


@event("NextInputSplit")
class NextInputSplit(Event):
    """The next split for a source subtask; ``split`` is ``None`` when none are left."""

    job_id: str
    execution_id: str
    split: JSON | None


@event("OperatorEvent")
class OperatorEvent(Event):
    """An event between an operator's coordinator and one of its subtasks.

    ``to_coordinator`` says the direction; ``body`` is the coordinator's own data.
    """

    job_id: str
    operator_id: str
    subtask: int
    to_coordinator: bool
    body: JSON
