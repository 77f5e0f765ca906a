"""The TaskManager's registration state machine, pure.

States: ``UNREGISTERED`` (waiting for a leader or for the backoff to pass),
``REGISTERING`` (a request is out), ``REGISTERED``, ``REFUSED`` (final: the leader said
trying again cannot help). Inputs are replies from the leader, leader heartbeats and
ticks with the current time; outputs are what the shell should do next. One door:
``decide(registration, stimulus, now) -> Decision`` (services/common/decision.py), the
stimulus a ``Tick`` or a message from the leader; every send goes to the cluster inbox.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from sluice.events import (
    PROTOCOL_VERSION,
    AcknowledgeRegistration,
    AlreadyRegistered,
    AttemptReport,
    DisconnectTaskManager,
    Event,
    JobManagerHeartbeat,
    RefuseRegistration,
    RegisterTaskManager,
    TaskManagerHeartbeat,
)
from sluice.services.common.decision import Address, Decision, Send

__all__ = ["RegistrationConfig", "Registration", "Tick", "decide"]

State = Literal["UNREGISTERED", "REGISTERING", "REGISTERED", "REFUSED"]


@dataclass(frozen=True)
class RegistrationConfig:
    initial_backoff_ms: int = 100
    max_backoff_ms: int = 2000
    heartbeat_interval_ms: int = 1000
    jobmanager_timeout_ms: int = 5000


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passes; ``leader_epoch`` is the epoch of the current lease holder, if any."""

    leader_epoch: int | None
    slots_free: int


def decide(reg: Registration, stimulus: Tick | Event, now: int) -> Decision:
    """The registration's one door: a tick, or a message from the leader in this
    TaskManager's inbox; ``reg`` changes as it decides."""
    if isinstance(stimulus, Tick):
        return Decision(sends=reg._tick(now, stimulus.leader_epoch, stimulus.slots_free))
    return Decision(sends=reg._receive(stimulus, now))


def _to_leader(message: Event) -> Send:
    return Send(Address.cluster(), message)


@dataclass
class Registration:
    resource_id: str
    session: str
    host: str
    slots: int
    config: RegistrationConfig = field(default_factory=RegistrationConfig)
    labels: dict[str, str] = field(default_factory=dict)
    state: State = "UNREGISTERED"
    epoch: int | None = None
    backoff_ms: int = 0
    next_attempt: int = 0
    next_heartbeat: int = 0
    last_leader_contact: int = 0
    refusal: str | None = None
    history: list[str] = field(default_factory=list)
    reporter: Callable[[], Sequence[AttemptReport]] = field(default=lambda: (), repr=False, compare=False)
    """The slot report, made when a registration or heartbeat goes out (so it is current)."""

    def _to(self, state: State, why: str) -> None:
        self.history.append(f"{self.state} -> {state}: {why}")
        del self.history[:-20]
        self.state = state

    # --- inputs --------------------------------------------------------------------------

    def _tick(self, now: int, leader_epoch: int | None, slots_free: int) -> list[Send]:
        if self.state == "REFUSED":
            return []
        if self.state == "REGISTERED":
            if leader_epoch is not None and leader_epoch > (self.epoch or 0):
                return self._reregister(now, leader_epoch, f"a new leader leads at epoch {leader_epoch}")
            if now - self.last_leader_contact > self.config.jobmanager_timeout_ms:
                self._to("UNREGISTERED", f"no heartbeat from the leader for {now - self.last_leader_contact} ms")
                self.next_attempt = now
                self.backoff_ms = 0
            elif now >= self.next_heartbeat:
                self.next_heartbeat = now + self.config.heartbeat_interval_ms
                return [
                    _to_leader(
                        TaskManagerHeartbeat(
                            self.resource_id, self.session, self.epoch or 0, slots_free, list(self.reporter())
                        )
                    )
                ]
            return []
        if now < self.next_attempt or leader_epoch is None:
            return []
        # UNREGISTERED, or REGISTERING with no answer within the backoff: (re)try.
        self.backoff_ms = min(max(self.backoff_ms * 2, self.config.initial_backoff_ms), self.config.max_backoff_ms)
        self.next_attempt = now + self.backoff_ms
        self._to("REGISTERING", f"registering with the leader at epoch {leader_epoch}")
        return [
            _to_leader(
                RegisterTaskManager(
                    self.resource_id,
                    self.session,
                    self.host,
                    self.slots,
                    PROTOCOL_VERSION,
                    leader_epoch,
                    dict(self.labels),
                    list(self.reporter()),
                )
            )
        ]

    def _receive(self, msg: Event, now: int) -> list[Send]:
        if isinstance(msg, JobManagerHeartbeat):
            if self.state == "REGISTERED":
                if msg.epoch == self.epoch:
                    self.last_leader_contact = now
                elif msg.epoch > (self.epoch or 0):
                    return self._reregister(now, msg.epoch, f"heartbeat from a new leader at epoch {msg.epoch}")
            return []
        if getattr(msg, "session", None) != self.session:
            return []  # a reply to an earlier session of this TaskManager
        if isinstance(msg, (AcknowledgeRegistration, AlreadyRegistered)):
            if self.state != "REFUSED":
                self.epoch = msg.epoch
                self.last_leader_contact = now
                self.next_heartbeat = now
                self.backoff_ms = 0
                self.config = RegistrationConfig(
                    self.config.initial_backoff_ms,
                    self.config.max_backoff_ms,
                    msg.heartbeat_interval_ms,
                    msg.heartbeat_timeout_ms,
                )
                self._to("REGISTERED", f"{msg.TYPE} at epoch {msg.epoch}")
        elif isinstance(msg, RefuseRegistration):
            if msg.retry:
                self._to("UNREGISTERED", f"refused, will retry: {msg.reason}")
            else:
                self.refusal = msg.reason
                self._to("REFUSED", msg.reason)
        elif isinstance(msg, DisconnectTaskManager):
            if self.state == "REGISTERED":
                return self._reregister(now, msg.epoch, msg.reason)
        return []

    def _reregister(self, now: int, epoch: int, why: str) -> list[Send]:
        self._to("UNREGISTERED", why)
        self.backoff_ms = 0
        self.next_attempt = now
        return self._tick(now, epoch, 0)
