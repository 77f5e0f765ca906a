"""Cluster membership and leadership: how TaskManagers join, stay and leave.

Messages (in inboxes and outboxes) keep Flink's protocol names; facts (in the cluster's
fact stream, the source of truth) are past-tense state changes decided by the leader.
"""

from __future__ import annotations

from dataclasses import field

from .schema import Event, event, record
from .types import TaskState

__all__ = [
    "AttemptReport",
    "RegisterTaskManager",
    "AcknowledgeRegistration",
    "AlreadyRegistered",
    "RefuseRegistration",
    "TaskManagerHeartbeat",
    "JobManagerHeartbeat",
    "UnregisterTaskManager",
    "DisconnectTaskManager",
    "TaskStatesRecorded",
    "ReportStorageReach",
    "TaskManagerRegistered",
    "TaskManagerStorageReach",
    "TaskManagerLost",
    "TaskManagerUnregistered",
    "LeadershipGranted",
    "LogRestarted",
]

# --- messages: TaskManager -> JobManager --------------------------------------------------


@record
class AttemptReport:
    """One line of a TaskManager's slot report: an attempt it holds (``state`` DEPLOYING
    until its worker took it, then RUNNING), or one that ended here whose final state
    (FINISHED, FAILED, CANCELED, with its ``error``) the leader has not yet confirmed."""

    job_id: str
    execution_id: str
    state: TaskState
    error: str | None = None

    @property
    def task_id(self) -> str:
        return f"{self.job_id}/{self.execution_id}"


@event("RegisterTaskManager", version=3)
class RegisterTaskManager(Event):
    """A TaskManager asks the leader at ``epoch`` to join with ``slots`` slots.

    ``session`` is new at every start of the TaskManager process, so the leader can tell
    a repeated request (same session) from a restarted TaskManager (new session).
    Version 2 added ``labels``; version 3 the slot report ``attempts`` (what it holds,
    and final states not yet confirmed), which the leader reconciles with its own view
    (None: no report, from a TaskManager of an earlier version: nothing is reconciled).
    """

    resource_id: str
    session: str
    host: str
    slots: int
    protocol_version: int
    epoch: int
    labels: dict[str, str] = field(default_factory=dict)
    attempts: list[AttemptReport] | None = None


@event("TaskManagerHeartbeat", version=2)
class TaskManagerHeartbeat(Event):
    """Version 2 added the slot report ``attempts`` (as in RegisterTaskManager). None: no
    report (a TaskManager of an earlier version), which is not the same as an empty one."""

    resource_id: str
    session: str
    epoch: int
    slots_free: int
    attempts: list[AttemptReport] | None = None


@event("UnregisterTaskManager")
class UnregisterTaskManager(Event):
    """A TaskManager that stops gracefully says goodbye."""

    resource_id: str
    session: str
    reason: str


@event("ReportStorageReach")
class ReportStorageReach(Event):
    """What a TaskManager saw at the leader's storage root: ``path`` (its ``_SLUICE_ROOT``)
    holding ``root_id`` (``problem`` None), or not, and why (missing, another root's id,
    unreadable, no answer in time)."""

    resource_id: str
    session: str
    storage_root: str
    root_id: str
    path: str
    problem: str | None = None


# --- messages: JobManager -> TaskManager --------------------------------------------------


@event("AcknowledgeRegistration", version=2)
class AcknowledgeRegistration(Event):
    """Version 2 added the leader's ``storage_root`` and its identity ``root_id`` (the id in
    ``<storage_root>/_SLUICE_ROOT``): the TaskManager checks that it sees that very root and
    says so (``ReportStorageReach``). Empty: nothing to check (an older leader, or a root
    that has no identity: not a local one, or one the leader could not write)."""

    resource_id: str
    session: str
    epoch: int
    heartbeat_interval_ms: int
    heartbeat_timeout_ms: int
    storage_root: str = ""
    root_id: str = ""


@event("AlreadyRegistered", version=2)
class AlreadyRegistered(Event):
    """The same TaskManager session registered again (a lost reply, or a new leader).
    Version 2 added ``storage_root`` and ``root_id``, as AcknowledgeRegistration did."""

    resource_id: str
    session: str
    epoch: int
    heartbeat_interval_ms: int
    heartbeat_timeout_ms: int
    storage_root: str = ""
    root_id: str = ""


@event("RefuseRegistration")
class RefuseRegistration(Event):
    """Registration refused; ``retry`` says whether trying again can succeed."""

    resource_id: str
    session: str
    epoch: int
    reason: str
    retry: bool


@event("JobManagerHeartbeat")
class JobManagerHeartbeat(Event):
    epoch: int
    leader_id: str


@event("TaskStatesRecorded")
class TaskStatesRecorded(Event):
    """The leader's log has the final state of these attempts (``job/execution`` ids) that
    the TaskManager's slot report still listed: it may forget them."""

    resource_id: str
    session: str
    epoch: int
    tasks: list[str]


@event("DisconnectTaskManager")
class DisconnectTaskManager(Event):
    """The leader no longer counts this TaskManager in (e.g. declared lost); register again."""

    resource_id: str
    session: str
    epoch: int
    reason: str


# --- facts --------------------------------------------------------------------------------


@event("TaskManagerRegistered")
class TaskManagerRegistered(Event):
    resource_id: str
    session: str
    host: str
    slots: int
    labels: dict[str, str] = field(default_factory=dict)


@event("TaskManagerStorageReach")
class TaskManagerStorageReach(Event):
    """The registered session of a TaskManager sees the storage root ``storage_root`` of
    identity ``root_id`` (``problem`` None), or cannot, and why, naming ``path``. Decided
    when its report changes what the table says; a new session starts unknown."""

    resource_id: str
    session: str
    storage_root: str
    root_id: str
    path: str
    problem: str | None = None


@event("TaskManagerLost")
class TaskManagerLost(Event):
    resource_id: str
    session: str
    reason: str


@event("TaskManagerUnregistered")
class TaskManagerUnregistered(Event):
    resource_id: str
    session: str
    reason: str


@event("LeadershipGranted", version=2)
class LeadershipGranted(Event):
    """A JobManager leads from now on. ``server`` is the run id of the Redis server whose
    log it rebuilt its state from: the next leader compares it with the server it finds,
    and a difference means the server restarted in between (and may have lost its last
    writes). Version 2 added ``server``."""

    epoch: int
    leader_id: str
    host: str
    server: str = ""


@event("LogRestarted", version=2)
class LogRestarted(Event):
    """The leader found that Redis restarted (run id ``before`` -> ``now``) without keeping
    every acknowledged write: attempts started before may be unknown to the log, so every
    attempt from now on is numbered at least ``attempt_floor`` (the server's clock then).

    ``slots``: on a Redis Cluster, the slot ranges (``[first, last]``, inclusive) whose
    master failed over (store/shards.py ``failed_slots``): only the tags in them may have
    lost writes, so only the jobs whose tag is there run their unfinished attempts again
    (and the TaskManagers register again only when the cluster's tag, or their own, is
    there). None: the whole log (one Redis). Version 2 added ``slots``."""

    before: str
    now: str
    attempt_floor: int
    reason: str
    slots: list[list[int]] | None = None
