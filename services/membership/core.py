"""Membership, pure: who is in the cluster, decided from messages, folded from facts.

``decide(state, stimulus, now)`` (the door: an ``Inbound`` message, or ``Timeouts``)
returns a ``Decision`` (services/common/decision.py): the facts a message causes and the
replies it gets; ``evolve(state, fact)`` applies one fact. Neither does I/O, reads a clock or
draws randomness: time comes in with the call. Liveness (when each TaskManager was
last heard from) is not history and is not folded from the log: a new leader starts
every TaskManager's heartbeat timeout afresh, as Flink's JobMaster does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from sluice.errors import MessageRejected, UnexpectedMessage
from sluice.events import (
    PROTOCOL_VERSION,
    AcknowledgeRegistration,
    AlreadyRegistered,
    DisconnectTaskManager,
    Envelope,
    Event,
    LeadershipGranted,
    LogRestarted,
    RefuseRegistration,
    RegisterTaskManager,
    ReportStorageReach,
    TaskManagerHeartbeat,
    TaskManagerLost,
    TaskManagerRegistered,
    TaskManagerStorageReach,
    TaskManagerUnregistered,
    UnregisterTaskManager,
)
from sluice.events.ids import id_problem
from sluice.services.common.decision import Address, Decision, Rejected, Send

_LAST_SLOT = 16383
"""A Redis Cluster's last slot (store/shards.py): a restart of the whole log covers 0 to it."""

__all__ = [
    "MembershipConfig",
    "TaskManagerRow",
    "Membership",
    "Decision",
    "Inbound",
    "Timeouts",
    "UnexpectedMessage",
    "decide",
    "evolve",
    "HeartbeatMonitor",
]

Status = Literal["REGISTERED", "LOST", "UNREGISTERED"]


@dataclass(frozen=True)
class MembershipConfig:
    heartbeat_interval_ms: int = 1000
    heartbeat_timeout_ms: int = 5000
    max_slots: int = 1024
    storage_root: str = ""
    """The leader's storage root, told to every TaskManager it acknowledges ("" with ``root_id``:
    nothing to check)."""
    root_id: str = ""
    """The identity of ``storage_root`` (its ``_SLUICE_ROOT``; the JobManager's shell reads it)."""


@dataclass(slots=True)
class TaskManagerRow:
    """One row of the TaskManager table."""

    resource_id: str
    session: str
    host: str
    slots: int
    labels: dict[str, str]
    status: Status
    since: int
    reason: str | None = None
    epoch: int = 0
    """The leader epoch that registered this session (its ``TaskManagerRegistered`` fact's;
    0: not known). An attempt placed on this TaskManager at an earlier epoch was placed on a
    registration that ended before this one began, even under the same session."""
    storage_root: str = ""
    """The storage root this session last reported on ("": not reported yet) ..."""
    root_id: str = ""
    """... of this identity, ..."""
    storage_path: str = ""
    """... looking at this path (its ``_SLUICE_ROOT``), ..."""
    storage_problem: str | None = None
    """... and why it cannot see it there (None: it sees it)."""

    def sees_root(self, storage_root: str, root_id: str) -> bool | None:
        """Whether this session reported that it sees the root ``storage_root`` of identity
        ``root_id`` (None: it has not reported on that root)."""
        if not root_id or (self.storage_root, self.root_id) != (storage_root, root_id):
            return None
        return self.storage_problem is None

    def to_dict(self) -> dict[str, object]:
        return {
            "resource_id": self.resource_id,
            "session": self.session,
            "host": self.host,
            "slots": self.slots,
            "labels": self.labels,
            "status": self.status,
            "since": self.since,
            "reason": self.reason,
            "epoch": self.epoch,
            "storage_root": self.storage_root,
            "root_id": self.root_id,
            "storage_path": self.storage_path,
            "storage_problem": self.storage_problem,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TaskManagerRow:
        return cls(**d)


@dataclass(slots=True)
class Membership:
    """The folded state: the leader's epoch and every TaskManager ever seen (departed ones
    keep their row with status LOST or UNREGISTERED)."""

    epoch: int = 0
    leader_id: str | None = None
    taskmanagers: dict[str, TaskManagerRow] = field(default_factory=dict)
    attempt_floor: int = 0
    """No attempt is numbered below it (raised when Redis restarted and may have lost writes)."""
    restart_reason: str = ""
    restarted: list[list[int]] = field(default_factory=list)
    """``[first slot, last slot, floor]`` of each restart still told apart: a job whose tag's
    slot is in a range runs its unfinished attempts again numbered at least that floor
    (``owed_floor``). A restart of the whole log (one Redis) is one range over every slot,
    and replaces those before it; one shard's failover adds its slot ranges."""

    def owed_floor(self, slot: int) -> int:
        """The floor a job whose tag is in ``slot`` is renumbered to (0: none owed)."""
        return max((f for a, b, f in self.restarted if a <= slot <= b), default=0)

    def active(self) -> list[TaskManagerRow]:
        return [r for r in self.taskmanagers.values() if r.status == "REGISTERED"]

    def is_registered(self, resource_id: str, session: str) -> bool:
        row = self.taskmanagers.get(resource_id)
        return row is not None and row.status == "REGISTERED" and row.session == session

    @property
    def total_slots(self) -> int:
        return sum(r.slots for r in self.active())


@dataclass(frozen=True)
class Inbound:
    """A message on the cluster inbox."""

    env: Envelope
    config: MembershipConfig


@dataclass(frozen=True)
class Timeouts:
    """Time passed (``now``: on the leader's monotonic clock, as ``monitor``'s)."""

    monitor: HeartbeatMonitor
    config: MembershipConfig


def _reply(resource_id: str, reply: Event) -> Decision:
    return Decision(sends=[Send(Address.taskmanager(resource_id), reply)])


# --- evolve ------------------------------------------------------------------------------


def evolve(state: Membership, env: Envelope) -> Membership:
    """Apply one fact to ``state`` (in place) and return it. Unknown facts change nothing."""
    ev = env.event
    if type(ev) is TaskManagerRegistered:
        state.taskmanagers[ev.resource_id] = TaskManagerRow(
            ev.resource_id, ev.session, ev.host, ev.slots, ev.labels, "REGISTERED", env.ts, None, env.epoch
        )
    elif type(ev) is TaskManagerLost or type(ev) is TaskManagerUnregistered:
        row = state.taskmanagers.get(ev.resource_id)
        if row is not None and row.session == ev.session:
            row.status = "LOST" if type(ev) is TaskManagerLost else "UNREGISTERED"
            row.since = env.ts
            row.reason = ev.reason
    elif type(ev) is TaskManagerStorageReach:
        row = state.taskmanagers.get(ev.resource_id)
        if row is not None and row.session == ev.session:
            row.storage_root, row.root_id, row.storage_path = ev.storage_root, ev.root_id, ev.path
            row.storage_problem = ev.problem
    elif type(ev) is LeadershipGranted:
        state.epoch = ev.epoch
        state.leader_id = ev.leader_id
    elif type(ev) is LogRestarted:
        state.attempt_floor = max(state.attempt_floor, ev.attempt_floor)
        state.restart_reason = ev.reason
        spans = [(0, _LAST_SLOT)] if ev.slots is None else [(a, b) for a, b in ev.slots]
        for a, b in spans:  # (a range inside a newer one is owed no more than the newer floor)
            state.restarted = [r for r in state.restarted if not (a <= r[0] and r[1] <= b)]
            state.restarted.append([a, b, ev.attempt_floor])
    return state


# --- decide ------------------------------------------------------------------------------


def decide(state: Membership, stimulus: Inbound | Timeouts, now: int) -> Decision:
    """Membership's one door: the facts and replies a cluster-inbox message causes, or the
    TaskManagers that timed out. It never raises: a message that cannot be answered (its
    resource id cannot be used to address the TaskManager) or that the cluster inbox does
    not take is ``Rejected`` before anything is decided, and parked with the reason."""
    if isinstance(stimulus, Timeouts):
        return _timeouts(state, stimulus.monitor, now, stimulus.config)
    try:
        return _message(state, stimulus.env.event, stimulus.config)
    except MessageRejected as exc:
        return Decision(instructions=[Rejected(exc)])


def _message(state: Membership, msg: Event, config: MembershipConfig) -> Decision:
    if isinstance(msg, (RegisterTaskManager, TaskManagerHeartbeat, UnregisterTaskManager, ReportStorageReach)):
        problem = id_problem(msg.resource_id, f"{msg.TYPE}'s resource id")
        if problem is not None:
            raise MessageRejected(problem + "; no reply can be addressed to it")
    if isinstance(msg, RegisterTaskManager):
        return _register(state, msg, config)
    if isinstance(msg, TaskManagerHeartbeat):
        if state.is_registered(msg.resource_id, msg.session):
            return Decision()
        return _reply(
            msg.resource_id,
            DisconnectTaskManager(
                msg.resource_id,
                msg.session,
                state.epoch,
                "this TaskManager is not registered with the leader (declared lost, or registered "
                "under another session); register again",
            ),
        )
    if isinstance(msg, UnregisterTaskManager):
        if state.is_registered(msg.resource_id, msg.session):
            return Decision([TaskManagerUnregistered(msg.resource_id, msg.session, msg.reason)])
        return Decision()  # already gone: leaving twice is harmless
    if isinstance(msg, ReportStorageReach):
        return _storage_reach(state, msg)
    raise UnexpectedMessage(
        f"{msg.TYPE} is not a message the JobManager takes on the cluster inbox "
        "(it takes RegisterTaskManager, TaskManagerHeartbeat, UnregisterTaskManager, ReportStorageReach)"
    )


def _storage_reach(state: Membership, msg: ReportStorageReach) -> Decision:
    """A registered session's report becomes a fact when it changes what the table says (a
    report repeated, at every registration or look, changes nothing); one from a session
    that is not registered is void (the next registration reports again)."""
    row = state.taskmanagers.get(msg.resource_id)
    if row is None or row.status != "REGISTERED" or row.session != msg.session:
        return Decision()
    said = (msg.storage_root, msg.root_id, msg.path, msg.problem)
    if (row.storage_root, row.root_id, row.storage_path, row.storage_problem) == said:
        return Decision()
    return Decision([TaskManagerStorageReach(msg.resource_id, msg.session, *said)])


def _register(state: Membership, msg: RegisterTaskManager, config: MembershipConfig) -> Decision:
    def refuse(reason: str, retry: bool) -> Decision:
        return _reply(msg.resource_id, RefuseRegistration(msg.resource_id, msg.session, state.epoch, reason, retry))

    if msg.protocol_version != PROTOCOL_VERSION:
        return refuse(
            f"protocol version mismatch: the TaskManager speaks {msg.protocol_version}, the JobManager "
            f"{PROTOCOL_VERSION}; run the same Sluice version on both",
            False,
        )
    if not 1 <= msg.slots <= config.max_slots:
        return refuse(f"invalid slot count {msg.slots}: a TaskManager offers 1 to {config.max_slots} slots", False)
    if not msg.host.strip():
        return refuse("empty host name: give the TaskManager a host (--host or $SLUICE_HOST)", False)
    if msg.epoch != state.epoch:
        return refuse(
            f"addressed to the leader of epoch {msg.epoch}, but the leader is at epoch {state.epoch}; "
            "read the current leader and register again",
            True,
        )
    told = (config.heartbeat_interval_ms, config.heartbeat_timeout_ms, config.storage_root, config.root_id)
    row = state.taskmanagers.get(msg.resource_id)
    if row is not None and row.status == "REGISTERED":
        if row.session == msg.session:
            return _reply(msg.resource_id, AlreadyRegistered(msg.resource_id, msg.session, state.epoch, *told))
        facts: list[Event] = [
            TaskManagerLost(row.resource_id, row.session, f"restarted: registered again as session {msg.session}"),
        ]
    else:
        facts = []
    facts.append(TaskManagerRegistered(msg.resource_id, msg.session, msg.host, msg.slots, dict(msg.labels)))
    decision = _reply(msg.resource_id, AcknowledgeRegistration(msg.resource_id, msg.session, state.epoch, *told))
    decision.facts += facts
    return decision


def _timeouts(state: Membership, monitor: HeartbeatMonitor, now: int, config: MembershipConfig) -> Decision:
    """TaskManagers not heard from for the heartbeat timeout are lost."""
    facts: list[Event] = []
    for row in state.active():
        last = monitor.last_seen.get(row.resource_id)
        if last is None:
            continue
        if now - last > config.heartbeat_timeout_ms:
            facts.append(
                TaskManagerLost(
                    row.resource_id,
                    row.session,
                    f"no heartbeat for {now - last} ms (timeout {config.heartbeat_timeout_ms} ms)",
                )
            )
    return Decision(facts)


@dataclass
class HeartbeatMonitor:
    """When each TaskManager was last heard from (soft state, not folded from the log)."""

    last_seen: dict[str, int] = field(default_factory=dict)

    def observe(self, resource_id: str, now: int) -> None:
        self.last_seen[resource_id] = now

    def forget(self, resource_id: str) -> None:
        self.last_seen.pop(resource_id, None)

    def restart(self, state: Membership, now: int) -> None:
        """A new leader gives every registered TaskManager a full timeout from now."""
        self.last_seen = {r.resource_id: now for r in state.active()}
