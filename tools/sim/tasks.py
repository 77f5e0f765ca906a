"""Slot workers in the simulation: tasks that take steps instead of running on Spark.

A TaskManager hands its tasks to ``SimSlots`` (its ``Slots``) as it would hand them to
RQ workers. Each task is an actor: it reports RUNNING, asks the source coordinator for
splits through the real ``TaskEvents`` (one step per request, per poll and per split),
reads its producers' partitions from ``SimFiles``, talks to its vertex's coordinator,
writes its partition or publishes its sink through the real publish protocol one file
operation per step, registers queryable state, and reports FINISHED. What it reads and
writes are split ids, so the invariants can check the result end to end.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sluice.errors import PartlyAppended, RedisUnavailable, WrongType
from sluice.events import (
    FIELD,
    Envelope,
    KeyGroupRange,
    NotifyKvStateRegistered,
    TaskDeploymentDescriptor,
    TaskState,
    descriptor_from_json,
    encode,
)
from sluice.services.dataplane.keygroups import key_group_range
from sluice.services.dataplane.publish import Publication, is_marker, parse, superseded
from sluice.services.dataplane.publish import abandoned as publish_abandoned
from sluice.services.kvstate.codec import state_id
from sluice.services.taskmanager.events import TaskEvents
from sluice.services.taskmanager.worker import report_produced, report_state
from sluice.store import EventLog, KvStates
from sluice.store.backend import Delegating

from .invariants import Violation

if TYPE_CHECKING:
    from .cluster import Simulation

__all__ = ["SimFiles", "SimSlots", "SimTask"]


class SimFiles:
    """The storage the data plane writes to (outside Redis: a Redis restart loses none of it)."""

    def __init__(self) -> None:
        self.files: dict[str, Any] = {}

    def listing(self, directory: str) -> list[str]:
        head = directory.rstrip("/") + "/"
        return sorted(p[len(head) :] for p in self.files if p.startswith(head) and "/" not in p[len(head) :])

    def sink_ids(self, directory: str) -> list[int]:
        """What a plain reader of a sink directory gets (Spark reads every data file in it,
        hidden ones aside): the ids of all its data files, in one list."""
        out: list[int] = []
        for name in self.listing(directory):
            if parse(name) is not None and not is_marker(name):
                out += self.files[directory.rstrip("/") + "/" + name]
        return out


class SimSlots:
    """One TaskManager's slot workers (its ``Slots``): a task waits in its slot's queue until
    the worker takes it; killing a worker kills its task."""

    def __init__(self, sim: Simulation, tm: str, log: EventLog) -> None:
        self.sim, self.tm, self.log = sim, tm, log
        if not isinstance(log.backend, Delegating):
            raise TypeError("SimSlots needs a simulation connection (its calls are where faults strike)")
        self.backend: Delegating = log.backend
        self.handles: set[str] = set()
        """Every launch that took effect."""
        self.attempts: set[tuple[str, str]] = set()
        """Every attempt (job, execution id) handed over: none twice."""
        self.n = 0
        self.tasks: dict[str, SimTask] = {}
        self._exited: list[tuple[int, str]] = []

    def start(self, slots: int) -> None:
        self.n = slots

    def launch(
        self,
        slot: int,
        descriptor: dict,
        runtime: dict,
        *,
        task_id: str,
        handle: str,
        reports: Sequence[tuple[str, Envelope]] = (),
    ) -> str:
        """The reports and the hand-over are one call to the log, as ProcessSlots's
        transaction: a fault strikes before it (nothing happened) or after it (all of it)."""
        d = descriptor_from_json(descriptor)

        def hand_over() -> str:
            if reports:
                self.backend.inner.xadd_many([(stream, {FIELD: encode(env)}) for stream, env in reports])
            if (d.job_id, d.execution_id) in self.attempts:  # running or ended: RQ would run it again
                raise Violation(
                    f"{self.tm} hands {d.execution_id} of {d.job_id} to its workers twice (it would run twice)"
                )
            task = SimTask(self.sim, self, handle, d, slot)
            self.tasks[handle] = task
            self.handles.add(handle)
            self.attempts.add(task.key)
            self.sim.tasks.append(task)
            return handle

        return self.backend.around("launch", hand_over)

    def handed_over(self, handle: str) -> bool:
        return self.backend.around("exists", lambda: handle in self.handles)

    def cancel_queued(self, handle: str) -> None:
        task = self.tasks.get(handle)
        if task is not None and not task.started:
            task.end("cancelled before a worker took it", ran=False)

    def started(self, handle: str) -> bool:
        task = self.tasks.get(handle)
        return True if task is None else task.started

    def alive(self, slot: int) -> bool:
        return True

    def kill(self, slot: int, *, wait: bool = False) -> None:
        for task in list(self.tasks.values()):
            if task.slot == slot and task.started and not task.done:
                task.end("its worker was killed", ran=False)
        if not wait:
            self._exited.append((slot, "signal 9"))

    def crash_worker(self, slot: int) -> None:
        """The slot's worker process dies on its own (out of memory, a segfault)."""
        self.kill(slot)

    def exited(self) -> list[tuple[int, str]]:
        out, self._exited = self._exited, []
        return out

    def stop(self) -> None:
        for task in list(self.tasks.values()):
            task.end("its TaskManager stopped", ran=False)
        self.tasks.clear()

    def sweep_sink(self, path: str, subtask: int, abandoned: int | None = None) -> None:
        files = self.sim.files
        listing = files.listing(path)
        gone = superseded(listing, subtask)
        if abandoned is not None:
            gone = (*gone, *(n for n in publish_abandoned(listing, subtask, abandoned) if n not in gone))
        for name in gone:
            files.files.pop(f"{path.rstrip('/')}/{name}", None)
        if gone:
            self.sim.note(f"{self.tm} deletes {len(gone)} superseded file(s) of sink subtask {subtask}")


@dataclass
class SimTask:
    sim: Simulation
    slots: SimSlots
    handle: str
    d: TaskDeploymentDescriptor
    slot: int
    started: bool = False
    done: bool = False
    phase: str = "queued"
    busy_until: int = 0
    consumed: list[int] = field(default_factory=list)
    events: TaskEvents | None = None
    publication: Publication | None = None
    data: list[int] = field(default_factory=list)
    hello: str = ""
    log: EventLog | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.d.job_id, self.d.execution_id)

    @property
    def name(self) -> str:
        return f"task {self.d.execution_id} of {self.d.job_id} on {self.slots.tm}"

    def end(self, why: str, *, ran: bool = True) -> None:
        """``ran``: False when it ended without running to its end (killed, cancelled,
        stopped): only a log that lost writes hands that attempt over again."""
        if not self.done:
            self.done = True
            self.slots.tasks.pop(self.handle, None)
            if not ran:
                self.slots.attempts.discard(self.key)
            self.sim.task_ended(self, why)

    def runnable(self, now: int) -> bool:
        return not self.done and now >= self.busy_until

    # --- the task's steps ---------------------------------------------------------------

    def _events(self) -> TaskEvents:
        if self.events is None:
            assert self.log is not None
            self.events = TaskEvents(
                self.log, self.d, f"host-{self.slots.tm}", world=self.sim.clock(self.slots.tm), blocking=False
            )
        return self.events

    def step(self) -> bool:
        """One step; a report that fails (Redis away, or an inbox refused it: its key holds
        another kind of value until its reader makes it again) is tried again at the next step."""
        sim, d = self.sim, self.d
        if self.done:
            return False
        if self.log is None:
            self.log = sim.connect(f"worker-{self.slots.tm}-{self.slot}", self)
        try:
            return self._step(sim, d)
        except (RedisUnavailable, PartlyAppended, WrongType):
            self.busy_until = sim.world.now + sim.rng.randint(5, 100)
            return True

    def _step(self, sim: Simulation, d: TaskDeploymentDescriptor) -> bool:
        assert self.log is not None
        if self.phase == "queued":
            self.started = True
            sim.task_started(self)
            self.phase = "report-running"
        if self.phase == "report-running":
            report_state(self.log, sim.clock(self.slots.tm), d, self.slots.tm, self.slot, TaskState.RUNNING)
            self.phase = "work"
            return True
        if self.phase == "work":
            if sim.faults.hit(sim.rng, "user_error", 0.03):
                self.phase = "report-failed"
                return True
            self.phase = "ask" if d.kind == "source" else "read"
            return True
        if self.phase == "report-failed":
            report_state(
                self.log,
                sim.clock(self.slots.tm),
                d,
                self.slots.tm,
                self.slot,
                TaskState.FAILED,
                error="(simulated) the user's code raised ValueError: bad row",
            )
            self.end("its user code raised")
            return True
        if self.phase == "ask":
            events = self._events()
            if events.unsent is not None:
                events.resend()  # it may have got through before: the leader takes it once
            else:
                events.ask_for_split()
            self.phase = "wait"
            return True
        if self.phase == "wait":
            assert self.events is not None
            self.events.poll()
            if not self.events.answered():
                self.busy_until = sim.world.now + sim.rng.randint(1, 20)
                return False
            split = self.events.take_split()
            if split is None:
                self.data = sorted(self.consumed)
                self.phase = "output"
                return True
            self.consumed.append(int(split["index"]))
            self.busy_until = sim.world.now + sim.work_ms(self.slots.tm)
            self.phase = "ask"
            return True
        if self.phase == "read":
            ids: list[int] = []
            for inp in d.inputs:
                start, end = inp.key_groups if inp.key_groups else (0, 1 << 30)
                for path in inp.partition_paths():
                    part = sim.files.files.get(path)
                    if part is None:
                        sim.violation(f"{self.name} reads {path}, a partition that does not exist")
                        self.end("its input is missing")
                        return True
                    ids += [i for i in part if start <= i % d.max_parallelism <= end]
            self.data = sorted(ids)
            self.busy_until = sim.world.now + sim.work_ms(self.slots.tm)
            self.phase = "hello" if sim.coordinated(d) else "output"
            return True
        if self.phase == "hello":
            events = self._events()
            if events.unsent is not None:
                events.resend()
            else:
                self.hello = f"{d.execution_id}#{sim.world.new_id()[:6]}"
                body: dict[str, Any] = {"hello": self.hello}
                if sim.faults.hit(sim.rng, "coordinator_error", 0.05):
                    body["boom"] = True
                events.send_to_coordinator(body)
            self.phase = "thanks"
            return True
        if self.phase == "thanks":
            assert self.events is not None
            reply = self.events.next_event(0.0)
            if reply is None:
                self.busy_until = sim.world.now + sim.rng.randint(1, 30)
                return False
            if reply != {"thanks": self.hello}:
                sim.violation(f"{self.name} said hello {self.hello} and got {reply!r}")
            self.phase = "output"
            return True
        if self.phase == "output":
            output = d.output
            if output:
                sim.files.files[output.path] = list(self.data)
                self.phase = "produced"
            else:
                self.phase = "sink"
            return True
        if self.phase == "produced":
            report_produced(self.log, sim.clock(self.slots.tm), d)
            self.phase = "sink"
            return True
        if self.phase == "sink":
            sink = d.sink
            if sink is None:
                self.phase = "state"
                return True
            directory = sink.path
            if self.publication is None:
                self.publication = Publication.start(d.subtask, d.attempt, ["sim"])
                staging = f"{directory}/_staging-{d.execution_id}"
                sim.files.files[staging] = list(self.data)
            pub = self.publication
            listing = sim.files.listing(directory) if pub.needs_listing else None
            pub, action = pub.advance(listing)
            self.publication = pub
            for name in action.move:
                sim.files.files[f"{directory}/{name}"] = [] if name.startswith("_") else list(self.data)
            for name in action.delete:
                sim.files.files.pop(f"{directory}/{name}", None)
            if pub.done:
                sim.files.files.pop(f"{directory}/_staging-{d.execution_id}", None)
                self.phase = "state"
            return True
        if self.phase == "state":
            q = d.queryable
            if q:
                name = q.name
                sid = state_id(d.job_id, name, d.execution_id)
                KvStates(self.log.backend, self.log.keys).write(d.job_id, sid, [], {"execution_id": d.execution_id})
                start, end = key_group_range(d.max_parallelism, d.parallelism, d.subtask)
                msg = NotifyKvStateRegistered(
                    d.job_id, d.vertex, KeyGroupRange(start, end), name, sid, "sim://redis", d.execution_id
                )
                self.log.append(
                    self.log.keys.inbox(self.log.keys.job(d.job_id)),
                    Envelope(msg, sim.world.new_id(), 0, sim.world.now, d.job_id),
                )
            self.phase = "finish"
            return True
        if self.phase == "finish":
            report_state(self.log, sim.clock(self.slots.tm), d, self.slots.tm, self.slot, TaskState.FINISHED)
            sim.task_finished(self)
            self.end("it finished")
            return True
        raise AssertionError(f"unknown phase {self.phase}")
