"""The coordinators of one job on the JobManager: creating them, feeding them the job's
facts, and turning what they do into facts to commit.

The JobManager's main loop is the only caller. It feeds every fact it commits for the job
(``feed``) and then asks for what the coordinators did (``flush``, a ``Decision``:
services/common/decision.py): events to subtasks (facts, each ``Deliver``ed to its
subtask's inbox), checkpoints, and failures (``FailJob``), which it commits in the same script as the facts that caused
them. A new leader replays the log the same way (``restore``): the last checkpoint of
each coordinator, then the facts after it. See ``coordinator`` for the delivery rules.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from sluice.events import (
    CoordinatorCheckpointed,
    Event,
    JobVertex,
    NextInputSplit,
    OperatorEvent,
    RequestNextInputSplit,
    TaskRestartScheduled,
    TaskState,
    UpdateTaskExecutionState,
)
from sluice.services.common.decision import Address, Decision, Deliver, FailJob
from sluice.services.jobs.machine import ABORTED_TASK
from sluice.services.jobs.state import execution_id, parse_execution_id

from .coordinator import CoordinatorContext, OperatorCoordinator
from .source import NO_MORE, REQUEST, SPLIT, SourceCoordinator

__all__ = ["JobCoordinators", "Delivery", "has_coordinator", "operator_of", "DEFAULT_CHECKPOINT_INTERVAL_MS"]

DEFAULT_CHECKPOINT_INTERVAL_MS = 2000

Delivery = tuple[str, int]
"""(vertex, subtask): whose inbox an event goes to."""

_Callback = tuple[Callable[..., Any], Any]
"""A coordinator's queued callback: (then, the result it is called with)."""


def has_coordinator(vertex: JobVertex) -> bool:
    return vertex.kind == "source" or bool(getattr(vertex, "coordinator", None))


@dataclass
class _Holder:
    vertex: JobVertex
    context: CoordinatorContext
    coordinator: OperatorCoordinator | None
    checkpoint_id: int = -1
    committing: int | None = None
    pending: list[tuple[Event, int]] = field(default_factory=list)
    dirty: bool = False
    want_checkpoint: bool = False
    last_checkpoint_ms: int = 0
    """When it was last checkpointed, on ``JobCoordinators.clock``."""
    failed: str | None = None
    muted: bool = False
    replayed: list[Event] = field(default_factory=list)
    recorded: list[Event] = field(default_factory=list)

    @property
    def deterministic(self) -> bool:
        return bool(self.coordinator is not None and self.coordinator.deterministic)


def describe(exc: BaseException, limit: int = 6000) -> str:
    text = "".join(traceback.format_exception(exc)).strip()
    return text if len(text) <= limit else text[-limit:]


class JobCoordinators:
    def __init__(
        self,
        job_id: str,
        vertices: Iterable[JobVertex],
        splits: dict[str, list[Any]],
        load: Callable[[str], type],
        *,
        interval_ms: int = DEFAULT_CHECKPOINT_INTERVAL_MS,
        executor: Callable[[str], Any] | None = None,
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        """Create every coordinator of a job, with unbound contexts (``load`` imports a
        user coordinator class from the job's code by ``module:qualname``). The checkpoint
        interval runs on ``monotonic`` (the leader's clock, in seconds; a wall clock that
        steps back would put checkpoints off by the step); None: on the times ``flush`` is given."""
        self.job_id = job_id
        self.interval_ms = interval_ms
        self._monotonic = monotonic
        self.holders: dict[str, _Holder] = {}
        self._early = Decision(job_id=job_id)
        for v in vertices:
            if not has_coordinator(v):
                continue
            ctx = CoordinatorContext(job_id, v.name, v.parallelism, executor)
            holder = self.holders[v.name] = _Holder(v, ctx, None)
            try:
                if v.kind == "source":
                    holder.coordinator = SourceCoordinator(
                        ctx,
                        splits.get(v.name, []),
                        v.source.protocol if v.source else "operator-events",
                        bool(v.source and v.source.each_split),
                    )
                else:
                    assert v.coordinator is not None  # has_coordinator: a vertex not a source names one
                    holder.coordinator = load(v.coordinator)(ctx)
            except Exception as exc:
                holder.failed = f"creating the coordinator of {v.name!r} failed:\n{describe(exc)}"

    def clock(self, now: int) -> int:
        """What the checkpoint interval is measured on: the monotonic clock, in ms (else ``now``)."""
        return now if self._monotonic is None else round(self._monotonic() * 1000)

    # --- life ---
    def restore(self, operator_id: str, checkpoint_id: int, state: Any, attempts: list[int] | None = None) -> None:
        """Reset a coordinator to its checkpoint; ``attempts``: each subtask's attempt then."""
        h = self.holders.get(operator_id)
        if h is None or h.coordinator is None:
            return
        h.checkpoint_id = checkpoint_id
        if attempts is not None:
            h.context._attempts[:] = attempts
        self._call(h, h.coordinator.reset_to_checkpoint, checkpoint_id, state)

    def start(self, now: int) -> None:
        """Leadership: bind every context and start every coordinator. One that was never
        checkpointed is checkpointed at once (so a later restore never starts it afresh)."""
        for h in self.holders.values():
            h.context._bind()
            h.last_checkpoint_ms = self.clock(now)
            if h.coordinator is not None and h.failed is None:
                self._call(h, h.coordinator.start)
                if h.checkpoint_id < 0:
                    h.want_checkpoint = True

    def close(self) -> None:
        for h in self.holders.values():
            if h.coordinator is not None:
                try:
                    with h.context.lock:
                        h.coordinator.close()
                except Exception:
                    pass
            h.context._close()

    # --- replay after a checkpoint (a new leader) ---
    def replay(self, tails: dict[str, list[Event]]) -> None:
        """Feed each coordinator the facts recorded after its last checkpoint. Deterministic
        coordinators answer muted, and their answers are checked against the log's."""
        for op, h in self.holders.items():
            self._drain(h, self._early, 0)  # what start() sent is new: released at the next flush
            h.muted = h.deterministic
            for ev in tails.get(op, ()):
                self.feed(ev)
        for op, h in self.holders.items():
            if not h.muted:
                continue
            self._drain(h, Decision(job_id=self.job_id), 0)
            h.muted = False
            if h.replayed != h.recorded and h.failed is None:
                h.failed = (
                    f"the coordinator of {op!r} is declared deterministic but, replaying the log after its "
                    f"checkpoint {h.checkpoint_id}, it sent {len(h.replayed)} events where the log has "
                    f"{len(h.recorded)} (first difference: "
                    f"{_first_difference(h.replayed, h.recorded)}); set deterministic = False"
                )
            h.replayed, h.recorded = [], []

    # --- feeding ---
    def feed(self, ev: Event) -> None:
        """One fact of the job, as the coordinators see it."""
        op = operator_of(ev)
        h = self.holders.get(op) if op is not None else None
        if h is None or h.coordinator is None:
            return
        c = h.coordinator
        if type(ev) is UpdateTaskExecutionState:
            h.dirty = True
            if ev.state == TaskState.SCHEDULED:
                self._call(h, c.subtask_scheduled, ev.subtask, ev.attempt)
            elif ev.state == TaskState.RUNNING:
                self._call(h, c.subtask_ready, ev.subtask, ev.attempt)
            elif ev.state == TaskState.FINISHED:
                self._call(h, c.subtask_finished, ev.subtask, ev.attempt)
            elif ev.state in ABORTED_TASK:
                self._call(h, c.subtask_failed, ev.subtask, ev.attempt, ev.error)
        elif type(ev) is TaskRestartScheduled:
            h.dirty = True
            h.context._attempts[ev.subtask] = ev.attempt
            self._call(h, c.subtask_reset, ev.subtask, ev.attempt)
        elif type(ev) is OperatorEvent:
            if ev.to_coordinator:
                h.dirty = True
                self._handle(h, ev.at, ev.subtask, ev.attempt, ev.body)
            elif h.muted:
                h.recorded.append(ev)
        elif type(ev) is RequestNextInputSplit:
            h.dirty = True
            attempt = parse_execution_id(ev.execution_id)[2]
            self._handle(h, ev.at, ev.subtask, attempt, {"type": REQUEST, "host": ev.host})
        elif type(ev) is NextInputSplit and h.muted:
            h.recorded.append(ev)

    def _handle(self, h: _Holder, at: int, subtask: int, attempt: int, body: Any) -> None:
        """An event from a subtask to its coordinator, with ``context.now`` the time the
        leader recorded it (0 in older facts: None, not known) while it is handled."""
        assert h.coordinator is not None  # feed passes only holders that have one
        h.context.now = at or None
        try:
            self._call(h, h.coordinator.handle_event_from_operator, subtask, attempt, body)
        finally:
            h.context.now = None

    def _call(self, h: _Holder, fn: Callable[..., Any], *args: Any) -> None:
        if h.failed is not None:
            return
        try:
            with h.context.lock:
                fn(*args)
        except Exception as exc:
            h.failed = f"the coordinator of {h.vertex.name!r} failed in {fn.__name__}:\n{describe(exc)}"

    # --- what they did ---
    def flush(self, now: int, *, force: bool = False) -> Decision:
        """Events to release, checkpoints to take and failures, since the last flush.
        Checkpoints are taken when asked for (``force``, ``request_checkpoint``), when a
        coordinator holds events back, and every ``interval_ms`` while inputs arrive."""
        out, self._early = self._early, Decision(job_id=self.job_id)
        for h in self.holders.values():
            self._drain(h, out, now)
            if h.coordinator is None or h.failed is not None or not h.context.bound:
                continue
            due = h.dirty and self.clock(now) - h.last_checkpoint_ms >= self.interval_ms
            if force or h.want_checkpoint or h.pending or due:
                self._checkpoint(h, out, now)
        for h in self.holders.values():
            if h.failed is not None:
                out.instructions.append(FailJob(h.failed))
        return out

    def _drain(self, h: _Holder, out: Decision, now: int, deferred: list[_Callback] | None = None) -> None:
        """Apply what the coordinator queued. With ``deferred`` (at a snapshot), callbacks
        are not run but collected: what they change belongs to the next checkpoint."""
        while True:
            actions = h.context._take()
            if not actions:
                return
            for kind, item in actions:
                if kind == "call" and deferred is not None:
                    deferred.append(item)
                    continue
                if kind == "send":
                    subtask, attempt, body = item
                    ev = self._event(h, subtask, attempt, body)
                    if h.muted:
                        h.replayed.append(ev)
                    elif h.deterministic:
                        self._emit(out, ev, h.vertex.name, subtask)
                    else:
                        h.pending.append((ev, subtask))
                elif kind == "fail" and h.failed is None:
                    cause = describe(item) if isinstance(item, BaseException) else str(item)
                    h.failed = f"the coordinator of {h.vertex.name!r} failed the job:\n{cause}"
                elif kind == "checkpoint":
                    h.want_checkpoint = True
                elif kind == "call":
                    then, result = item
                    self._call(h, then, result)

    def _emit(self, out: Decision, ev: Event, vertex: str, subtask: int) -> None:
        """A fact of the coordinator that is also delivered to the subtask's inbox."""
        out.instructions.append(Deliver(len(out.facts), Address.of_subtask(self.job_id, vertex, subtask)))
        out.facts.append(ev)

    def _event(self, h: _Holder, subtask: int, attempt: int, body: Any) -> Event:
        v = h.vertex
        if (
            v.kind == "source"
            and v.source is not None
            and v.source.protocol == "input-splits"
            and isinstance(body, dict)
            and body.get("type") in (SPLIT, NO_MORE)
        ):
            return NextInputSplit(self.job_id, execution_id(v.name, subtask, attempt), body.get("split"))
        return OperatorEvent(self.job_id, v.name, subtask, False, body, attempt)

    def _checkpoint(self, h: _Holder, out: Decision, now: int) -> None:
        assert h.coordinator is not None  # flush checkpoints only the holders that have one
        cid = h.checkpoint_id + 1
        later: list[_Callback] = []
        try:
            with h.context.lock:
                state = h.coordinator.checkpoint_coordinator(cid)
                state = orjson.loads(orjson.dumps(state))  # a copy: the live state may change on
                self._drain(h, out, now, later)  # what it sent up to the snapshot belongs to it
        except Exception as exc:
            h.failed = f"checkpoint {cid} of the coordinator of {h.vertex.name!r} failed:\n{describe(exc)}"
            return
        finally:
            for then, result in later:  # after the snapshot: their effects go to the next checkpoint
                self._call(h, then, result)
        for ev, subtask in h.pending:
            self._emit(out, ev, h.vertex.name, subtask)
        out.facts.append(CoordinatorCheckpointed(self.job_id, h.vertex.name, cid, state, len(h.pending)))
        h.pending = []
        h.checkpoint_id, h.committing = cid, cid
        h.dirty, h.want_checkpoint, h.last_checkpoint_ms = False, False, self.clock(now)

    def committed(self) -> None:
        """The last flush is in the log: tell the coordinators their checkpoints completed."""
        for h in self.holders.values():
            if h.committing is not None and h.coordinator is not None:
                cid, h.committing = h.committing, None
                self._call(h, h.coordinator.notify_checkpoint_complete, cid)


def _first_difference(a: list[Event], b: list[Event]) -> str:
    for x, y in zip(a, b):
        if x != y:
            return f"{x!r} vs {y!r}"
    return "one list is longer"


def operator_of(ev: Event) -> str | None:
    """The operator (vertex) a fact concerns, for the facts coordinators are fed."""
    if type(ev) is UpdateTaskExecutionState or type(ev) is TaskRestartScheduled or type(ev) is RequestNextInputSplit:
        return ev.vertex_id
    if type(ev) is OperatorEvent or type(ev) is CoordinatorCheckpointed:
        return ev.operator_id
    if type(ev) is NextInputSplit:
        return parse_execution_id(ev.execution_id)[0]
    return None
