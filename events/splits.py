"""Input splits, operator coordinators and their events.

Two ways for a source subtask to get work, both answered by the source's coordinator
(one assignment core):

* the seed protocol: ``RequestNextInputSplit`` -> ``NextInputSplit`` (``split`` is
  ``None`` when none are left);
* FLIP-27: ``OperatorEvent``s between the subtask's reader and the coordinator's split
  enumerator (``{"type": "request-split"}`` -> ``{"type": "split", ...}`` or
  ``{"type": "no-more-splits"}``).

Requests and events from subtasks arrive in the job's inbox and are recorded as facts
when the leader takes them; replies are facts too, and go to the subtask's own inbox in
the same commit. ``CoordinatorCheckpointed`` records a coordinator's state.
"""

from __future__ import annotations

from .schema import JSON, Event, event

__all__ = ["RequestNextInputSplit", "NextInputSplit", "OperatorEvent", "CoordinatorCheckpointed", "TriggerCheckpoint"]


@event("RequestNextInputSplit", version=3)
class RequestNextInputSplit(Event):
    """A source subtask asks for its next split. ``seq`` numbers what one attempt sends
    (1, 2, …), so a request sent twice (the sender could not tell whether the first got
    through) is answered once; 0: unnumbered. ``at``: the leader's clock (ms) when it
    recorded the request as a fact (0 in what a subtask sends, and in older facts): the
    coordinator's only clock, so a replayed coordinator decides the same. Version 2 added
    ``seq``, version 3 ``at``."""

    job_id: str
    vertex_id: str
    subtask: int
    execution_id: str
    host: str
    seq: int = 0
    at: int = 0


@event("NextInputSplit")
class NextInputSplit(Event):
    """The next split for a source subtask; ``split`` is ``None`` when none are left."""

    job_id: str
    execution_id: str
    split: JSON | None


@event("OperatorEvent", version=4)
class OperatorEvent(Event):
    """An event between an operator's coordinator and one of its subtasks.

    ``to_coordinator`` says the direction; ``attempt`` is the execution attempt of the
    subtask that sent it or that it is meant for (a later attempt ignores events meant
    for an earlier one); ``body`` is the coordinator's own data. ``seq`` numbers what one
    attempt sends to its coordinator (1, 2, …) so an event sent twice is taken once (0:
    unnumbered). ``at``: as for ``RequestNextInputSplit``, set on an event to the
    coordinator when the leader records it. Version 2 added ``attempt``, version 3 ``seq``,
    version 4 ``at``.
    """

    job_id: str
    operator_id: str
    subtask: int
    to_coordinator: bool
    body: JSON
    attempt: int = 0
    seq: int = 0
    at: int = 0


@event("CoordinatorCheckpointed")
class CoordinatorCheckpointed(Event):
    """A coordinator's state at checkpoint ``checkpoint_id``: it reflects every fact of the
    job's stream before this one (a new leader restores it and replays the rest)."""

    job_id: str
    operator_id: str
    checkpoint_id: int
    state: JSON
    released: int = 0
    """Events to subtasks that this checkpoint released (held back until it was taken)."""


@event("TriggerCheckpoint")
class TriggerCheckpoint(Event):
    """Ask the leader to checkpoint every coordinator of a job now (``sluice checkpoint``)."""

    job_id: str
    reason: str = "requested"
