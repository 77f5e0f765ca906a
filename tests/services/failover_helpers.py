"""Small real pieces the failover regression tests drive the JobManager and TaskManager
with, on a real Redis: a clock the test moves, a TaskManager's slots that record what
they were handed, readers of the log, and a loop that steps processes until a condition.

Steps are called with ``block_ms=None``: on a real Redis, ``XREADGROUP BLOCK 0`` waits
forever, so a step that is told to block 0 ms on an empty inbox never returns.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from sluice.events import (
    PROTOCOL_VERSION,
    Envelope,
    Event,
    JobEdge,
    JobGraph,
    JobVertex,
    RegisterTaskManager,
    RestartStrategy,
    SinkSpec,
    SourceSpec,
    SubmitJob,
    SubmitTask,
    TaskState,
)
from sluice.events.descriptor import descriptor_from_json
from sluice.services.coordination.coordinator import OperatorCoordinator
from sluice.services.jobmanager import JobManager, Phase
from sluice.services.jobs.state import JobRun, JobsState, evolve
from sluice.services.taskmanager.core import RegistrationConfig
from sluice.services.taskmanager.process import TaskManager
from sluice.services.taskmanager.worker import report_produced, report_state
from sluice.store import Blobs, EventLog
from sluice.store.backend import Delegating

__all__ = [
    "CODE",
    "HANDLED",
    "CountingCoordinator",
    "ManualWorld",
    "TinySlots",
    "WrittenAgainAtOnce",
    "coordinated_running",
    "events",
    "job_state",
    "keyed_graph",
    "lead",
    "produced",
    "pump",
    "register_message",
    "register_tm",
    "started",
    "report",
    "source_graph",
    "submit",
    "submit_tasks",
]

CODE = b"# the failover tests' jobs run no user code: their workers are the test\n"


class ManualWorld:
    """A World whose clock moves only when the test says (ids are random). The wall clock
    starts at the real time, so event times look like Redis's own (lease TTLs and entry ids
    still follow Redis's clock)."""

    def __init__(self) -> None:
        self.now = time.time_ns() // 1_000_000
        self.mono = 0.0

    def now_ms(self) -> int:
        return self.now

    def monotonic(self) -> float:
        return self.mono

    def new_id(self) -> str:
        return os.urandom(16).hex()

    def advance(self, ms: int) -> None:
        self.now += ms
        self.mono += ms / 1000


class TinySlots:
    """A TaskManager's workers (its ``Slots``) that run nothing: each task handed over is
    recorded and counts as begun at once; the test reports for it as its worker would. A
    launch's reports are appended through ``log`` (``tm()`` gives it the TaskManager's)."""

    def __init__(self, log: EventLog | None = None) -> None:
        self.log = log
        self.n = 0
        self.launched: list[tuple[int, dict, str]] = []
        """(slot, task deployment descriptor as JSON, handle) of every task handed over."""
        self.runtimes: list[dict] = []
        """The runtime (what the worker is told besides the descriptor) of every task handed over."""
        self.cancelled: list[str] = []
        self.killed: list[int] = []
        self.swept: list[tuple[str, int]] = []
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
        if reports:
            if self.log is None:
                raise TypeError("TinySlots needs the log to send a launch's reports: TinySlots(log)")
            self.log.append_each(reports)
        self.launched.append((slot, dict(descriptor), handle))
        self.runtimes.append(dict(runtime))
        return handle

    def handed_over(self, handle: str) -> bool:
        return any(h == handle for _, _, h in self.launched)

    def cancel_queued(self, handle: str) -> None:
        self.cancelled.append(handle)

    def started(self, handle: str) -> bool:
        return True

    def kill(self, slot: int, *, wait: bool = False) -> None:
        self.killed.append(slot)
        if not wait:
            self._exited.append((slot, "signal 9"))

    def alive(self, slot: int) -> bool:
        return 0 <= slot < self.n

    def exited(self) -> list[tuple[int, str]]:
        out, self._exited = self._exited, []
        return out

    def stop(self) -> None:
        pass

    def sweep_sink(self, path: str, subtask: int, abandoned: int | None = None) -> None:
        self.swept.append((path, subtask))


class WrittenAgainAtOnce(Delegating):
    """A backend under which something writes ``key`` again (a string) right after each
    script batch, so an inbox moved aside there is clobbered again at once."""

    def __init__(self, inner: Any, key: str) -> None:
        super().__init__(inner)
        self.key = key

    def around(self, name: str, call: Any) -> Any:
        out = call()
        if name == "script_many":
            self.inner.delete(self.key)
            self.inner.set(self.key, b"again")
        return out


HANDLED: list[tuple[int, int, int, Any]] = []
"""Every call of ``CountingCoordinator.handle_event_from_operator``: (coordinator instance,
subtask, attempt, event). A test clears it first."""


class CountingCoordinator(OperatorCoordinator):
    """A user coordinator that records each event its handler is given (and sends nothing)."""

    def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
        HANDLED.append((id(self), subtask, attempt, event))

    def checkpoint_coordinator(self, checkpoint_id: int) -> Any:
        return {}

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        pass


# --- jobs ---------------------------------------------------------------------------------


def source_graph(
    name: str, parallelism: int = 1, splits: int = 4, *, protocol: str = "input-splits", max_parallelism: int = 128
) -> JobGraph:
    """One source vertex reading ``splits`` splits of numbers into a sink (restarts without delay)."""
    src = JobVertex(
        "src",
        "source",
        parallelism,
        [],
        SourceSpec("range", [], 1, {"start": "0", "end": str(splits)}, protocol),
        SinkSpec("parquet", f"file:///tmp/{name}-out"),
    )
    return JobGraph(name, [src], [], max_parallelism, RestartStrategy("fixed-delay", 3, 0, 1000))


def keyed_graph(name: str, splits: int = 4, coordinator: str | None = None) -> JobGraph:
    """src -> (keyed) agg, agg with ``coordinator``."""
    src = JobVertex(
        "src", "source", 1, [], SourceSpec("range", [], 1, {"start": "0", "end": str(splits)}, "input-splits")
    )
    agg = JobVertex(
        "agg", "transform", 1, ["failover_job:agg"], None, SinkSpec("parquet", f"file:///tmp/{name}-out"), coordinator
    )
    return JobGraph(
        name, [src, agg], [JobEdge("src", "agg", "keyed", "id")], 8, RestartStrategy("fixed-delay", 3, 0, 1000)
    )


def submit(
    log: EventLog,
    world: Any,
    job_id: str,
    graph: JobGraph,
    *,
    reply_to: str | None = None,
    code_blob: str | None = None,
) -> None:
    """What ``sluice submit`` sends: the code as a blob, then SubmitJob to the cluster inbox."""
    keys = log.keys
    digest = Blobs(log).put(CODE) if code_blob is None else code_blob
    reply = reply_to if reply_to is not None else keys.inbox(keys.client("c1"))
    log.append(
        keys.inbox(keys.cluster),
        Envelope(
            SubmitJob(job_id, graph, digest, "failover_job", reply, {}), world.new_id(), 0, world.now_ms(), job_id
        ),
    )


def register_message(world: Any, rid: str, session: str = "s1", *, slots: int = 1, epoch: int = 1) -> Envelope:
    return Envelope(
        RegisterTaskManager(rid, session, "host-a", slots, PROTOCOL_VERSION, epoch), world.new_id(), 0, world.now_ms()
    )


def report(log: EventLog, world: Any, d: dict, rid: str, slot: int, state: TaskState) -> None:
    """What the task's worker reports (the real worker function; ``d``: the descriptor as
    the worker is handed it, JSON)."""
    report_state(log, world, descriptor_from_json(d), rid, slot, state)


def produced(log: EventLog, world: Any, d: dict) -> None:
    report_produced(log, world, descriptor_from_json(d))


# --- reading the log ------------------------------------------------------------------------


def events(log: EventLog, stream: str, kind: type | tuple[type, ...] = Event) -> list[Any]:
    """The events of ``stream`` (an inbox, facts or outbox) of the given type(s), in order."""
    return [env.event for _, env in log.replay(stream) if isinstance(env.event, kind)]


def job_state(log: EventLog, job_id: str) -> JobRun:
    state = JobsState()
    for _, env in log.replay(log.keys.facts(log.keys.job(job_id))):
        evolve(state, env)
    return state.jobs[job_id]


def submit_tasks(log: EventLog, rid: str) -> list[SubmitTask]:
    return events(log, log.keys.inbox(log.keys.taskmanager(rid)), SubmitTask)


# --- driving processes ----------------------------------------------------------------------


def lead(jm: JobManager, world: ManualWorld | None = None, *, timeout: float = 10.0) -> int:
    """Step ``jm`` until it leads (waiting, in real time, for another holder's lease to
    lapse); its epoch."""
    deadline = time.monotonic() + timeout
    while not jm.leading:
        if time.monotonic() > deadline:
            raise AssertionError(f"{jm.id} did not become leader within {timeout} s (phase {jm.phase})")
        if not jm.step(block_ms=None) and jm.phase is Phase.STANDBY:
            if world is not None:
                world.advance(jm.lease.ttl_ms // 4 + 1)
            time.sleep(0.02)
    assert jm.epoch is not None
    return jm.epoch


def pump(
    steps: Iterable[Callable[[], Any]],
    until: Callable[[], bool],
    *,
    rounds: int = 200,
    what: str = "the condition",
    world: ManualWorld | None = None,
    advance_ms: int = 0,
) -> None:
    """Call each step in turn until ``until()`` holds (at most ``rounds`` rounds); between
    rounds the test clock moves ``advance_ms``."""
    steps = list(steps)
    for _ in range(rounds):
        if until():
            return
        for step in steps:
            step()
        if world is not None and advance_ms:
            world.advance(advance_ms)
    if not until():
        raise AssertionError(f"{what} did not happen within {rounds} rounds")


def jm(log: EventLog, world: Any, name: str, tmp_path: Path, **kw: Any) -> JobManager:
    kw.setdefault("lease_ttl_ms", 3000)
    return JobManager(
        log, world=world, jm_id=name, storage_root=f"file://{tmp_path}/storage", checkpoint_interval_ms=600_000, **kw
    )


def tm(
    log: EventLog, world: Any, tmp_path: Path, slots: TinySlots, *, rid: str = "tm-1", n: int = 2, **kw: Any
) -> TaskManager:
    if slots.log is None:
        slots.log = log
    return TaskManager(
        log,
        resource_id=rid,
        slots=n,
        host="host-a",
        world=world,
        runner=slots,
        home=tmp_path / rid,
        config=RegistrationConfig(50, 400, 100, 600_000),
        **kw,
    )


def started(
    log: EventLog, tmp_path: Path, slots: TinySlots | None = None, *, n: int = 2, world: ManualWorld | None = None
) -> tuple[ManualWorld, JobManager, TaskManager, TinySlots]:
    """A leading JobManager and one registered TaskManager (``tm-1``, ``n`` slots run by
    ``slots``, TinySlots by default), on a test clock (``world``, a ManualWorld by default)."""
    world = world if world is not None else ManualWorld()
    a = jm(log, world, "jm-a", tmp_path)
    lead(a, world)
    slots = slots if slots is not None else TinySlots()
    t = tm(log, world, tmp_path, slots, n=n)
    register_tm(a, t, world)
    return world, a, t, slots


def coordinated_running(
    log: EventLog, world: ManualWorld, tmp_path: Path, *, jm_log: EventLog | None = None
) -> tuple[JobManager, TaskManager, dict, dict]:
    """Leader jm-a (a 300 ms lease; writing through ``jm_log`` if given) with job j1: src ->
    agg, agg's user coordinator a ``CountingCoordinator``, both subtasks RUNNING on tm-1.
    Returns the leader, the TaskManager and the descriptors of src and agg."""
    a = jm(jm_log or log, world, "jm-a", tmp_path, lease_ttl_ms=300)
    assert lead(a, world) == 1
    slots = TinySlots()
    t = tm(log, world, tmp_path, slots)
    register_tm(a, t, world)
    steps = [lambda: a.step(block_ms=None), a.step_lease, lambda: t.step(block_ms=None)]
    submit(log, world, "j1", keyed_graph("j1", splits=4, coordinator=f"{__name__}:CountingCoordinator"))
    pump(steps, lambda: len(slots.launched) == 1, what="the source's deployment", world=world, advance_ms=10)
    src = slots.launched[0][1]
    report(log, world, src, "tm-1", 0, TaskState.RUNNING)
    produced(log, world, src)
    pump(steps, lambda: len(slots.launched) == 2, what="the consumer's deployment", world=world, advance_ms=10)
    agg = slots.launched[1][1]
    report(log, world, agg, "tm-1", 1, TaskState.RUNNING)
    pump(
        steps,
        lambda: a.state.jobs.jobs["j1"].vertices["agg"].subtasks[0].state == TaskState.RUNNING,
        what="the consumer running",
        world=world,
        advance_ms=10,
    )
    return a, t, src, agg


def register_tm(jm: JobManager, tm: TaskManager, world: ManualWorld) -> None:
    """Start ``tm`` and step both until the leader has acknowledged its registration."""
    tm.start()
    pump(
        [lambda: tm.step(block_ms=None), lambda: jm.step(block_ms=None), jm.step_lease],
        lambda: tm.reg.state == "REGISTERED",
        what=f"{tm.resource_id}'s registration",
        world=world,
        advance_ms=50,
    )
