"""The checks that run inside the actors' calls to the log (``faults.FaultyBackend`` calls
them as a call runs): one leader per epoch, fencing, the order in which an inbox's entries
are decided, TaskManagers declared lost only for a true silence, attempts failed as missing
only if missing; and what they remember to judge by (the epochs seen, the entries decided,
the heartbeats each JobManager read, the deliveries a clobber destroyed)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sluice.events import (
    FIELD,
    RegisterTaskManager,
    TaskManagerHeartbeat,
    TaskManagerLost,
    TaskOperationResult,
    TaskState,
    UpdateTaskExecutionState,
)
from sluice.events.envelope import decode_bytes
from sluice.store.log import committed_events, entry_order
from sluice.store.memory import MemoryBackend

from .config import TIMEOUT_MS
from .invariants import Violation

if TYPE_CHECKING:
    from .cluster import Simulation

__all__ = ["Watch"]


class Watch:
    """What the log's calls are checked against, as they run."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.clobbered: dict[tuple[str, str], tuple[str, str]] = {}
        """Outbox entries delivered to an inbox a hostile client then clobbered: (origin, ref) ->
        (inbox, entry id there)."""
        self.fenced: list[tuple[str, str, int, int]] = []
        """Commits that ran below their tag's fence (each must have been refused)."""
        self.epochs: dict[int, tuple[str, int]] = {}
        self.decided: dict[str, tuple[tuple[int, int], str, int]] = {}
        """Per inbox, the latest entry a commit decided: (its order, its id, when)."""
        self.heard: dict[str, list[tuple[int, bytes]]] = {}
        """JobManager instance -> the TaskManagers' heartbeats and registrations it read
        within about a timeout (the entry's time, Redis's: true time; the raw event, decoded
        only when that instance declares a TaskManager lost)."""

    def forget_after(self, ms: int) -> None:
        """Redis restarted and lost its writes after ``ms``: what they did is undone."""
        self.epochs = {e: w for e, w in self.epochs.items() if w[1] <= ms}
        self.decided = {s: d for s, d in self.decided.items() if d[2] <= ms}
        # a delivery the loss undid (with the clobber that destroyed it) is delivered again
        self.clobbered = {k: v for k, v in self.clobbered.items() if entry_order(v[1])[0] <= ms}

    def destroyed(self, inbox: str) -> None:
        """``inbox`` is about to be destroyed by someone else: what was delivered to it is
        gone with the stream (the outbox check does not count it as lost)."""
        for entry_id, fields in self.sim.store.entries(inbox):
            origin, ref = fields.get(b"from"), fields.get(b"ref")
            if origin is not None and ref is not None:
                self.clobbered[(origin.decode(), ref.decode())] = (inbox, entry_id)

    def committed(self, actor: str, epoch: int, fence_key: str) -> None:
        """At most one leader commits per epoch (in what the log keeps), and a commit below
        its tag's fence never lands."""
        stale = [f for f in self.fenced if f[0] == actor and f[1] == fence_key and f[2] == epoch]
        if stale:
            raise Violation(
                f"{actor} committed to {fence_key} at epoch {epoch}, below the tag's fence at epoch "
                f"{stale[0][3]}: a deposed leader's write landed"
            )
        self.fenced.clear()
        if not actor.startswith("jm") or epoch <= 0:
            return
        writer = actor
        seen = self.epochs.get(epoch)
        if seen is not None and seen[0] != writer:
            raise Violation(f"two leaders commit at epoch {epoch}: {seen[0]} and {writer} (to {fence_key})")
        self.epochs[epoch] = (writer, self.sim.world.now)

    def check_order(self, keys: Any, args: Any) -> None:
        """No message of an inbox is decided after a later one of the same inbox (a deposed
        leader's read must not let the new leader decide what followed it first)."""
        n = int(args[3])
        if not n:
            return
        stream = keys[1]
        ids = [a if isinstance(a, str) else a.decode() for a in args[4 : 4 + n]]
        orders = [entry_order(i) for i in ids]
        last = self.decided.get(stream)
        if orders != sorted(orders) or (last is not None and orders[0] < last[0]):
            before = last[1] if last is not None else ids[0]
            raise Violation(
                f"{stream}: entry {ids[0]} decided after a later entry {before} of the same inbox "
                f"(the commit's entries: {ids})"
            )
        self.decided[stream] = (orders[-1], ids[-1], self.sim.world.now)

    def check_losses(self, actor: str, keys: Any, args: Any) -> None:
        """A TaskManager is declared lost for its silence only if it was silent: not while a
        heartbeat it sent well within the timeout before the decision waits, never read, in
        the cluster inbox. (A leader decides on a view read to the end at most half a
        timeout before, so whatever came before that was read; unless it says it decides
        while behind, after the inbox stayed behind for longer than the timeout.) Nor within
        a timeout, in true time, of a heartbeat of it that the leader read itself (whatever
        its wall clock says: a step of it is no silence)."""
        jm = self.sim.jm_instances.get(actor)  # the instance that commits (it may be one that died since)
        if jm is None or keys[0] != self.sim.keys.fence(self.sim.keys.cluster):
            return
        lost = []
        for _, raw, _ in committed_events(args):
            raw = raw if isinstance(raw, bytes) else str(raw).encode()
            if b"TaskManagerLost" not in raw:  # (decoded only if it may be one)
                continue
            env = decode_bytes(raw)
            if isinstance(env.event, TaskManagerLost) and env.event.reason.startswith("no heartbeat"):
                lost.append(env)
        for env in lost:  # not within a timeout (true time) of a heartbeat it read itself
            ev = env.event
            assert isinstance(ev, TaskManagerLost)
            heard = self.heard_from(actor, ev.resource_id, ev.session)
            if heard is not None and self.sim.world.now - heard < TIMEOUT_MS - 5:
                raise Violation(
                    f"{actor} declared {ev.resource_id} lost ({ev.reason}) {self.sim.world.now - heard} ms "
                    f"after it read a heartbeat of it (timeout {TIMEOUT_MS} ms)"
                )
        if not lost or jm.timeouts_while_behind:
            return
        inbox = self.sim.keys.inbox(self.sim.keys.cluster)
        delivered = self.sim.store.groups(inbox).get("jobmanager")
        for env in lost:
            ev = env.event
            assert isinstance(ev, TaskManagerLost)
            ts = self.sim.true_ms(actor.split(".")[0], env.ts)  # (stamped by the leader's clock; entry ids: Redis's)
            for entry_id, fields in self.sim.store.entries(inbox):
                ms = entry_order(entry_id)
                if delivered is not None and ms <= entry_order(delivered):
                    continue
                if not ts - TIMEOUT_MS < ms[0] < ts - TIMEOUT_MS // 2:
                    continue
                try:
                    said = decode_bytes(fields[FIELD]).event
                except Exception:
                    continue
                if isinstance(said, (TaskManagerHeartbeat, RegisterTaskManager)) and (
                    said.resource_id,
                    said.session,
                ) == (ev.resource_id, ev.session):
                    raise Violation(
                        f"{actor} declared {ev.resource_id} lost ({ev.reason}) at "
                        f"{ts - self.sim.world.start}, while its {said.TYPE} {entry_id}, sent "
                        f"{ts - ms[0]} ms before, waited unread in the cluster inbox"
                    )

    def read_by_jobmanager(self, actor: str, rows: Any) -> None:
        """Note the TaskManagers' heartbeats (and registrations) ``actor`` read."""
        inbox = self.sim.keys.inbox(self.sim.keys.cluster)
        heard = None
        if isinstance(rows, tuple):  # read as the sole consumer: (entries, others' pending)
            rows = rows[0]
        for stream, entry_id, fields in rows:
            raw = fields.get(FIELD) if stream == inbox and fields is not None else None
            if raw is None or (b"TaskManagerHeartbeat" not in raw and b"RegisterTaskManager" not in raw):
                continue
            if heard is None:
                heard = self.heard.setdefault(actor, [])
                if len(heard) > 64:  # only those within a timeout can matter
                    heard[:] = [h for h in heard if h[0] > self.sim.world.now - 2 * TIMEOUT_MS]
            heard.append((entry_order(entry_id)[0], raw))

    def heard_from(self, actor: str, resource_id: str, session: str) -> int | None:
        """When the newest heartbeat or registration of that TaskManager read by ``actor`` was sent."""
        newest = None
        for ms, raw in self.heard.get(actor, ()):
            try:
                said = decode_bytes(raw).event
            except Exception:
                continue
            if isinstance(said, (TaskManagerHeartbeat, RegisterTaskManager)) and (said.resource_id, said.session) == (
                resource_id,
                session,
            ):
                newest = ms if newest is None else max(newest, ms)
        return newest

    def check_reconciled(self, actor: str, keys: Any, args: Any) -> None:
        """An attempt is failed as missing from its TaskManager's slot report only if that
        TaskManager (the same registration) does not hold it."""
        jm = self.sim.jm_instances.get(actor)
        if jm is None:
            return
        for _, raw, _ in committed_events(args):
            raw = raw if isinstance(raw, bytes) else str(raw).encode()
            if b"no longer holds it" not in raw:  # (decoded only if it may be one)
                continue
            ev = decode_bytes(raw).event
            if not (
                isinstance(ev, UpdateTaskExecutionState)
                and ev.state == TaskState.FAILED
                and "no longer holds it" in (ev.error or "")
            ):
                continue
            tm = next((p.tm for p in self.sim.tms if p.name == ev.taskmanager), None)
            if tm is not None and f"{ev.job_id}/{ev.execution_id}" in tm.tasks:
                raise Violation(
                    f"{actor} failed {ev.job_id}/{ev.execution_id} as missing from the slot report of "
                    f"{ev.taskmanager}, which holds it"
                )

    def fence_check(self, actor: str, fence_key: str, epoch: int, call: Any) -> None:
        """A deposed leader's write never lands: a commit at an epoch below its tag's fence
        (as it stands when the commit runs) must be refused."""
        if self.sim.store.down:
            return
        peek = MemoryBackend(self.sim.store, name="fence-check")
        fence = peek.get(fence_key)
        if fence is not None and epoch < int(fence):
            self.fenced.append((actor, fence_key, epoch, int(fence)))

    def sent_by_taskmanager(self, tm: str, fields: Any) -> None:
        """A TaskManager never reports an attempt that runs on it as having failed to start
        (a repeated SubmitTask once cost restarts that way)."""
        raw = fields.get(b"e") if isinstance(fields, dict) else None
        if raw is None or b"TaskOperationResult" not in raw:
            return
        ev = decode_bytes(raw).event
        if isinstance(ev, TaskOperationResult) and not ev.success:
            proc = next(p for p in self.sim.tms if p.name == tm)
            held = [
                t
                for t in proc.slots.tasks.values()
                if not t.done and (t.d.job_id, t.d.execution_id) == (ev.job_id, ev.execution_id)
            ]
            if held:
                raise Violation(
                    f"{tm} reports that {ev.execution_id} of {ev.job_id} failed to start "
                    f"({ev.message}) while it runs there"
                )
