"""The simulated cluster: actors, the seeded scheduler, faults, and the run of one seed.

Every actor wraps a real component: ``JobManager`` (its main loop and its lease renewal),
``TaskManager`` (with ``SimSlots`` for workers), the ``Projector``, the ``Client``, the
coordinators' worker threads, and the tasks. The scheduler picks one runnable actor a
step; the clock moves a little after every step and jumps when nothing is due. Faults
strike between steps (a crash, a pause, a Redis restart, a clock jump, a client's hostile
message) and inside the actors' calls to the log (``faults.FaultyBackend``).

A run has a fault phase, then faults stop and the world must settle: every job ends
within a bound, and the end-state checks run.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import tempfile
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from sluice.client import Client, JobFile
from sluice.errors import JobNotFound, RedisUnavailable, WrongType
from sluice.events import (
    FIELD,
    Envelope,
    RegisterTaskManager,
    SubmitJob,
    TaskManagerHeartbeat,
    TaskManagerLost,
    TaskState,
    UpdateTaskExecutionState,
)
from sluice.events.envelope import decode_bytes
from sluice.services.jobmanager import JobManager, Phase
from sluice.services.jobs.core import JobsConfig
from sluice.services.jobs.state import TERMINAL_JOB, JobsState, SlotPool
from sluice.services.membership.core import MembershipConfig
from sluice.services.projector import Projector
from sluice.services.taskmanager.core import RegistrationConfig
from sluice.services.taskmanager.process import TaskManager
from sluice.store import Deliverer, EventLog, Keys, tag_of
from sluice.store.log import committed_events, entry_order
from sluice.store.memory import MemoryBackend, MemoryStore

from . import jobs as simjobs
from .comeback import Comebacks
from .faults import Crash, Faults, FaultyBackend
from .invariants import (
    Observer,
    Violation,
    check_job_result,
    check_kvstate,
    check_outboxes,
    check_retention,
    normal_jobs,
    normal_membership,
)
from .skew import SkewWatch, newer_decode
from .tasks import SimFiles, SimSlots, SimTask
from .world import ProcessClock, SimWorld

__all__ = ["Outcome", "SimConfig", "Simulation", "run_seed"]

HEARTBEAT_MS = 100
TIMEOUT_MS = 1000
LEASE_MS = 600
_BASE: Path | None = None


def _base() -> Path:
    global _BASE
    if _BASE is None:
        shm = Path("/dev/shm")  # memory, where there is one: the TaskManagers' files cost no disk I/O
        _BASE = Path(tempfile.mkdtemp(prefix="sluice-sim-", dir=shm if shm.is_dir() and os.access(shm, os.W_OK)
                                      else None))
    return _BASE


@dataclass
class SimConfig:
    seed: int
    fault_steps: int = 1200
    settle_ms: int = 120_000
    """After faults stop, every job must end within this much simulated time."""
    faults: Faults | None = None
    """None: drawn from the seed (swarm)."""
    check_every: int = 50
    jobmanagers: int | None = None
    taskmanagers: int | None = None
    jobs: int | None = None
    max_stall_s: float = 5.0
    """The JobManagers' stall limit (a replay step or a read is progress)."""
    replay_page: int | None = None
    """Facts a new leader replays per step (None: drawn from the seed)."""
    serve_after_s: float | None | str = "seed"
    """A new leader's rebuild time before it serves while rebuilding the jobs left ("seed":
    drawn from the seed; None: it serves only once every job is rebuilt)."""


@dataclass
class Outcome:
    seed: int
    ok: bool
    violation: str | None
    steps: int
    sim_ms: int
    facts: int
    faults: list[str]
    jobs: dict[str, str]
    trace: str = ""


class Executor:
    """A coordinator's worker thread, as an actor: what it is given runs as scheduler steps."""

    def __init__(self, sim: Simulation, name: str) -> None:
        self.sim, self.name = sim, name
        self.queue: deque[Callable[[], Any]] = deque()
        self.closed = False
        sim.executors.append(self)

    def submit(self, fn: Callable[[], Any]) -> None:
        if not self.closed:
            self.queue.append(fn)

    def shutdown(self, wait: bool = False, cancel_futures: bool = False) -> None:
        self.closed = True
        self.queue.clear()

    def step(self) -> bool:
        if not self.queue:
            return False
        self.queue.popleft()()
        return True


class Process:
    """One process of the cluster: it can be paused, can crash and restarts."""

    name = "?"
    paused_until = 0
    wake_at = 0

    def runnable(self, now: int) -> bool:
        return now >= self.paused_until and now >= self.wake_at

    def step(self) -> bool:
        raise NotImplementedError

    def crash(self) -> None:
        raise NotImplementedError


class JMProcess(Process):
    def __init__(self, sim: Simulation, index: int) -> None:
        self.sim, self.index, self.gen = sim, index, 0
        self.start()

    def start(self) -> None:
        self.gen += 1
        self.name = f"jm{self.index}.{self.gen}"
        sim = self.sim
        self.jm = JobManager(sim.connect(self.name, self), world=sim.clock(f"jm{self.index}"), jm_id=self.name,
                             config=MembershipConfig(HEARTBEAT_MS, TIMEOUT_MS), lease_ttl_ms=LEASE_MS,
                             jobs_config=JobsConfig(slot_timeout_ms=60_000, deploy_timeout_ms=3 * TIMEOUT_MS), max_stall_s=sim.cfg.max_stall_s,
                             checkpoint_interval_ms=200, storage_root=f"file://{sim.home}/storage",
                             replay_page=sim.cfg.replay_page or sim.rng.choice((3, 50, 1000)),
                             batch=sim.rng.choice((2, 8, 500)),  # small: a backlog spans several reads
                             coordinator_executor=lambda name: Executor(sim, name),
                             serve_after_s=sim.rng.choice((0.0, 0.05, None)) if sim.cfg.serve_after_s == "seed"
                             else cast("float | None", sim.cfg.serve_after_s),
                             freeze_gc=False)  # process-wide: the JobManagers and the seeds share this process
        sim.jm_instances[self.name] = self.jm
        self.next_renew = 0

    def renewal_due(self, now: int) -> bool:
        """The renewal thread's turn: it runs on its own, whatever the main loop does."""
        return now >= self.next_renew and self.jm.phase is not Phase.STANDBY and now >= self.paused_until

    def renew(self) -> bool:
        self.next_renew = self.sim.world.now + LEASE_MS // 3
        try:
            return self.jm.step_lease()
        except RedisUnavailable:
            return True

    def step(self) -> bool:
        now = self.sim.world.now
        try:
            return self.jm.step()
        except RedisUnavailable:
            self.wake_at = now + self.sim.rng.randint(20, 200)
            return True

    def crash(self) -> None:
        self.jm.job_inboxes.close_coordinators()
        self.sim.check_errors(self)
        self.start()


class TMProcess(Process):
    def __init__(self, sim: Simulation, index: int, slots: int) -> None:
        self.sim, self.index, self.slots_n, self.gen = sim, index, slots, 0
        self.name = f"tm{index}"
        self.start()

    def start(self) -> None:
        self.gen += 1
        sim = self.sim
        log = sim.connect(f"{self.name}.{self.gen}", self)
        self.slots = SimSlots(sim, self.name, log)
        self.tm = TaskManager(log, resource_id=self.name, slots=self.slots_n,
                              host=f"host-{self.name}", world=sim.clock(self.name), runner=self.slots,
                              config=RegistrationConfig(50, 400, HEARTBEAT_MS, TIMEOUT_MS),
                              home=sim.home / self.name)
        self.begun = False

    def step(self) -> bool:
        try:
            if not self.begun:
                self.tm.start()
                self.begun = True
                return True
            return self.tm.step()
        except RedisUnavailable:
            self.wake_at = self.sim.world.now + self.sim.rng.randint(20, 200)
            return True

    def crash(self) -> None:
        self.slots.stop()  # its workers die with it
        self.start()


class ProjectorProcess(Process):
    name = "projector"

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.start()

    def start(self) -> None:
        self.projector = Projector(self.sim.connect("projector", self))
        self.loaded = False

    def step(self) -> bool:
        try:
            if not self.loaded:
                self.projector.load()
                self.loaded = True
                return True
            return self.projector.step(block_ms=None) > 0
        except RedisUnavailable:
            self.loaded = False
            self.wake_at = self.sim.world.now + self.sim.rng.randint(20, 200)
            return True

    def crash(self) -> None:
        self.start()


class ClientProcess(Process):
    """Submits the seed's jobs (again, if a restart of Redis lost a submission), and, when
    those faults are on, cancels jobs and sends hostile messages."""

    name = "client"

    def __init__(self, sim: Simulation, jobs: list[simjobs.SimJob]) -> None:
        self.sim, self.jobs = sim, jobs
        self.log = sim.connect("client", self)
        self.api = Client(self.log, "c1", world=sim.clock("client"), refused_wait_s=0)
        self.submitted: dict[str, int] = {}
        self.cancelled: set[str] = set()

    def step(self) -> bool:
        sim = self.sim
        now = sim.world.now
        try:
            for job in self.jobs:
                known = job.job_id in sim.observer.registered
                last = self.submitted.get(job.job_id)
                if not known and (last is None or now - last > 5_000):
                    digest = hashlib.sha256(simjobs.CODE).hexdigest()
                    self.api.submit(JobFile(Path("sim.py"), simjobs.CODE, digest, "sim_job", None,
                                               job.graph, {}), job_id=job.job_id)
                    self.submitted[job.job_id] = now
                    sim.note(f"client: submitted {job.job_id}")
                    return True
            if sim.faulting and sim.faults.hit(sim.rng, "cancel", 0.01):
                job = sim.rng.choice(self.jobs)
                if job.job_id in sim.observer.jobs.jobs and job.job_id not in self.cancelled:
                    try:
                        self.api.cancel(job.job_id, "(simulated) the user cancels")
                    except JobNotFound:  # a restart of Redis lost it since: it is submitted again
                        sim.note(f"client: {job.job_id} is gone (Redis lost its last writes)")
                        return True
                    self.cancelled.add(job.job_id)
                    sim.note(f"client: cancelled {job.job_id}")
                    return True
            if sim.faulting and sim.faults.hit(sim.rng, "hostile", 0.05):
                self.hostile()
                return True
        except (RedisUnavailable, WrongType):  # (WrongType: the cluster inbox is clobbered until the leader reads)
            self.wake_at = now + sim.rng.randint(20, 200)
            return True
        self.wake_at = now + 50
        return False

    def hostile(self) -> None:
        sim, keys, rng = self.sim, self.sim.keys, self.sim.rng
        cluster = keys.inbox(keys.cluster)
        bad_id = rng.choice(("}", "{", "*", "a\nb", "x" * 100_000, "", "tm 1"))
        job = rng.choice(self.jobs)
        kind = rng.randrange(7)
        env: Envelope | None = None
        if kind == 6:
            from sluice.services.jobmanager.process import GROUP as JM_GROUP
            from sluice.services.taskmanager.process import GROUP as TM_GROUP

            self.clobber(*rng.choice([(cluster, JM_GROUP), (keys.inbox(keys.job(job.job_id)), JM_GROUP),
                                      *((keys.inbox(keys.taskmanager(p.name)), TM_GROUP) for p in sim.tms)]))
            return
        if kind == 0:
            env = Envelope(RegisterTaskManager(bad_id, "s", "h", 1, 1, 1), sim.world.new_id(), 0, sim.world.now)
        elif kind == 1:
            env = Envelope(TaskManagerHeartbeat(bad_id, "s", 1, 0), sim.world.new_id(), 0, sim.world.now)
        elif kind == 2:
            reply = rng.choice(("no-tag", keys.inbox(keys.job(job.job_id)), "{other:client:x}:inbox", bad_id))
            env = Envelope(SubmitJob("h" + sim.world.new_id()[:6], job.graph, "0" * 64, "m", reply, {}),
                           sim.world.new_id(), 0, sim.world.now)
        elif kind == 3:
            env = Envelope(SubmitJob(bad_id, job.graph, "0" * 64, "m", keys.inbox(keys.client("c1")), {}),
                           sim.world.new_id(), 0, sim.world.now)
        if env is not None:
            self.log.append(cluster, env)
        elif kind == 4:
            self.log.append_raw(rng.choice((cluster, keys.inbox(keys.job(job.job_id)))),
                                {b"e": rng.choice((b"{not json", b'{"type":"Nope","v":1}', b"\xff"))})
        else:
            from sluice.events import JSON, OperatorEvent, TaskState, UpdateTaskExecutionState

            ev = rng.choice((
                UpdateTaskExecutionState(job.job_id, "src:99:0", TaskState.FINISHED, None, "src", 99, 0, "tm0", 0),
                UpdateTaskExecutionState(job.job_id, "nope", TaskState.RUNNING),
                OperatorEvent(job.job_id, "src", -1, True, JSON({"type": "request-split"}), 0),
                OperatorEvent(job.job_id, "zzz", 0, True, JSON({}), 0),
            ))
            self.log.append(keys.inbox(keys.job(job.job_id)), Envelope(ev, sim.world.new_id(), 0, sim.world.now,
                                                                      job.job_id))
        sim.note(f"client: sent a hostile message ({kind})")

    def clobber(self, inbox: str, group: str) -> None:
        """Something else writes an inbox's key (a string where the stream was): its reader
        must move it aside and make the inbox again, and whoever writes to it meanwhile must
        lose nothing. Only an inbox whose every entry was read and acknowledged: what a
        clobber destroys is lost to anyone, and proves nothing about Sluice."""
        sim = self.sim
        backend = sim.observer.reader  # unfaulted: nothing runs inside it (no delivery between look and write)
        try:
            last, state = backend.last_id(inbox), backend.group_state(inbox, group)
        except WrongType:
            return  # clobbered already
        if last is not None and (state is None or state.last_delivered != last or state.pending):
            return  # unread or pending entries: not this time
        sim.destroyed(inbox)
        backend.delete(inbox)
        backend.set(inbox, b"(simulated) someone else's value")
        sim.note(f"client: clobbered {inbox} with a string")

    def crash(self) -> None:
        pass


class Simulation:
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        rng = self.rng
        self.world = SimWorld(random.Random(rng.getrandbits(64)))
        self.faults = cfg.faults if cfg.faults is not None else Faults.swarm(rng)
        self.store = MemoryStore(self.world.now_ms, seed=rng.getrandbits(32))
        self.clobbered: dict[tuple[str, str], tuple[str, str]] = {}
        """Outbox entries delivered to an inbox a hostile client then clobbered: (origin, ref) ->
        (inbox, entry id there)."""
        # appendfsync always (a restart loses nothing) or everysec (it may lose the last second)
        self.store.durable = not self.faults.on("redis_lose") and rng.random() < 0.5
        self.keys = Keys("sim")
        self.files = SimFiles()
        self.home = _base() / f"seed-{cfg.seed}"  # the TaskManagers' disks: fresh for every run
        shutil.rmtree(self.home, ignore_errors=True)
        self.faulting = True
        self.depth = 0
        self.calls = 0
        self.steps = 0
        self.notes: deque[str | _Line] = deque(maxlen=80)
        self.jm_instances: dict[str, JobManager] = {}  # by connection name: every instance ever started
        self.tasks: list[SimTask] = []
        self.ended_tasks = False
        self.executors: list[Executor] = []
        self.live: dict[tuple[str, str], SimTask] = {}
        self.fenced: list[tuple[str, str, int, int]] = []
        """Commits that ran below their tag's fence (each must have been refused)."""
        self.epochs: dict[int, tuple[str, int]] = {}
        self.decided: dict[str, tuple[tuple[int, int], str, int]] = {}
        """Per inbox, the latest entry a commit decided: (its order, its id, when)."""
        self.heard: dict[str, list[tuple[int, bytes]]] = {}
        """JobManager instance -> the TaskManagers' heartbeats and registrations it read
        within about a timeout (the entry's time, Redis's: true time; the raw event, decoded
        only when that instance declares a TaskManager lost)."""
        self.clocks: dict[str, ProcessClock] = {}
        """Each host's clocks, with ``clock_skew`` on (drawn from a stream of their own: the
        seed's other draws stay what they were)."""
        self.clock_rng = random.Random(f"clock_skew {cfg.seed}")
        self.slow_tm = f"tm{rng.randrange(3)}" if self.faults.on("slow_reader") else None
        simjobs.VIOLATIONS.clear()
        self.decode: Callable[[bytes], Envelope] = decode_bytes
        """How every reader but an older JobManager decodes (with ``schema_skew``: as a newer Sluice)."""
        self.skew: SkewWatch | None = None
        if self.faults.on("schema_skew"):
            self.decode, self.skew = newer_decode, SkewWatch()
        self.comebacks = Comebacks()
        n_jm = cfg.jobmanagers or rng.randint(2, 3)
        n_tm = cfg.taskmanagers or rng.randint(1, 3)
        self.sim_jobs = [simjobs.draw_job(rng, i) for i in range(cfg.jobs or rng.randint(1, 2))]
        self.coordinated_vertices = {(j.job_id, j.last) for j in self.sim_jobs if j.coordinated}
        self.observer = Observer(self)
        self.jms = [JMProcess(self, i) for i in range(n_jm)]
        self.tms = [TMProcess(self, i, rng.randint(1, 3)) for i in range(n_tm)]
        self.projector = ProjectorProcess(self)
        self.user = ClientProcess(self, self.sim_jobs)
        self.processes: list[Process] = [*self.jms, *self.tms, self.projector, self.user]

    # --- for the actors ---------------------------------------------------------------

    def connect(self, name: str, owner: Any = None) -> EventLog:
        """A new connection to the log for ``owner`` (the process or task whose calls go
        through it: while one of its calls is paused, it cannot take another step)."""
        older = self.skew is not None and isinstance(owner, JMProcess) and owner.index > 0
        return EventLog(FaultyBackend(MemoryBackend(self.store, name=name), self, name, owner), self.keys,
                        decode=decode_bytes if older else self.decode)

    def clock(self, host: str) -> SimWorld | ProcessClock:
        """The clocks of a process on ``host`` (a JobManager ``jm<i>``, a TaskManager and its
        workers ``tm<i>``, the ``client``): the world's own unless ``clock_skew`` is on."""
        if not self.faults.on("clock_skew"):
            return self.world
        clock = self.clocks.get(host)
        if clock is None:
            rng = self.clock_rng
            skew = rng.choice((0, 3, 40, 250, 900, 2500, 20_000)) * rng.choice((-1, 1))
            clock = self.clocks[host] = ProcessClock(self.world, skew, rng.randint(0, 10**6) / 1000)
        return clock

    def destroyed(self, inbox: str) -> None:
        """``inbox`` is about to be destroyed by someone else: what was delivered to it is
        gone with the stream (the outbox check does not count it as lost)."""
        for entry_id, fields in self.store.entries(inbox):
            origin, ref = fields.get(b"from"), fields.get(b"ref")
            if origin is not None and ref is not None:
                self.clobbered[(origin.decode(), ref.decode())] = (inbox, entry_id)

    def true_ms(self, host: str, ms: int) -> int:
        """A wall-clock time read on ``host`` just now, as the world's time."""
        clock = self.clocks.get(host)
        return ms - clock.offset_ms if clock is not None else ms

    def note(self, text: str) -> None:
        self.notes.append(f"step {self.steps:>5} t={self.world.elapsed_ms / 1000:8.3f}s  {text}")

    def violation(self, text: str) -> None:
        raise Violation(text)

    def work_ms(self, tm: str) -> int:
        ms = self.rng.randint(5, 60)
        return ms * 5 if tm == self.slow_tm else ms

    def coordinated(self, d: Any) -> bool:
        return (d.job_id, d.vertex) in self.coordinated_vertices

    def can_crash(self, actor: str) -> bool:
        return self.faults.on("crash_mid_call") and not actor.startswith("client")

    def committed(self, actor: str, epoch: int, fence_key: str) -> None:
        """At most one leader commits per epoch (in what the log keeps), and a commit below
        its tag's fence never lands."""
        stale = [f for f in self.fenced if f[0] == actor and f[1] == fence_key and f[2] == epoch]
        if stale:
            raise Violation(f"{actor} committed to {fence_key} at epoch {epoch}, below the tag's fence at epoch "
                            f"{stale[0][3]}: a deposed leader's write landed")
        self.fenced.clear()
        if not actor.startswith("jm") or epoch <= 0:
            return
        writer = actor
        seen = self.epochs.get(epoch)
        if seen is not None and seen[0] != writer:
            raise Violation(f"two leaders commit at epoch {epoch}: {seen[0]} and {writer} (to {fence_key})")
        self.epochs[epoch] = (writer, self.world.now)

    def check_order(self, keys: Any, args: Any) -> None:
        """No message of an inbox is decided after a later one of the same inbox (a deposed
        leader's read must not let the new leader decide what followed it first)."""
        n = int(args[3])
        if not n:
            return
        stream = keys[1]
        ids = [a if isinstance(a, str) else a.decode() for a in args[4:4 + n]]
        orders = [entry_order(i) for i in ids]
        last = self.decided.get(stream)
        if orders != sorted(orders) or (last is not None and orders[0] < last[0]):
            before = last[1] if last is not None else ids[0]
            raise Violation(f"{stream}: entry {ids[0]} decided after a later entry {before} of the same inbox "
                            f"(the commit's entries: {ids})")
        self.decided[stream] = (orders[-1], ids[-1], self.world.now)

    def check_losses(self, actor: str, keys: Any, args: Any) -> None:
        """A TaskManager is declared lost for its silence only if it was silent: not while a
        heartbeat it sent well within the timeout before the decision waits, never read, in
        the cluster inbox. (A leader decides on a view read to the end at most half a
        timeout before, so whatever came before that was read; unless it says it decides
        while behind, after the inbox stayed behind for longer than the timeout.) Nor within
        a timeout, in true time, of a heartbeat of it that the leader read itself (whatever
        its wall clock says: a step of it is no silence)."""
        jm = self.jm_instances.get(actor)  # the instance that commits (it may be one that died since)
        if jm is None or keys[0] != self.keys.fence(self.keys.cluster):
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
            if heard is not None and self.world.now - heard < TIMEOUT_MS - 5:
                raise Violation(f"{actor} declared {ev.resource_id} lost ({ev.reason}) {self.world.now - heard} ms "
                                f"after it read a heartbeat of it (timeout {TIMEOUT_MS} ms)")
        if not lost or jm.timeouts_while_behind:
            return
        inbox = self.keys.inbox(self.keys.cluster)
        delivered = self.store.groups(inbox).get("jobmanager")
        for env in lost:
            ev = env.event
            assert isinstance(ev, TaskManagerLost)
            ts = self.true_ms(actor.split(".")[0], env.ts)  # (stamped by the leader's clock; entry ids: Redis's)
            for entry_id, fields in self.store.entries(inbox):
                ms = entry_order(entry_id)
                if delivered is not None and ms <= entry_order(delivered):
                    continue
                if not ts - TIMEOUT_MS < ms[0] < ts - TIMEOUT_MS // 2:
                    continue
                try:
                    said = decode_bytes(fields[FIELD]).event
                except Exception:
                    continue
                if isinstance(said, (TaskManagerHeartbeat, RegisterTaskManager)) \
                        and (said.resource_id, said.session) == (ev.resource_id, ev.session):
                    raise Violation(f"{actor} declared {ev.resource_id} lost ({ev.reason}) at "
                                    f"{ts - self.world.start}, while its {said.TYPE} {entry_id}, sent "
                                    f"{ts - ms[0]} ms before, waited unread in the cluster inbox")

    def read_by_jobmanager(self, actor: str, rows: Any) -> None:
        """Note the TaskManagers' heartbeats (and registrations) ``actor`` read."""
        inbox = self.keys.inbox(self.keys.cluster)
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
                    heard[:] = [h for h in heard if h[0] > self.world.now - 2 * TIMEOUT_MS]
            heard.append((entry_order(entry_id)[0], raw))

    def heard_from(self, actor: str, resource_id: str, session: str) -> int | None:
        """When the newest heartbeat or registration of that TaskManager read by ``actor`` was sent."""
        newest = None
        for ms, raw in self.heard.get(actor, ()):
            try:
                said = decode_bytes(raw).event
            except Exception:
                continue
            if isinstance(said, (TaskManagerHeartbeat, RegisterTaskManager)) \
                    and (said.resource_id, said.session) == (resource_id, session):
                newest = ms if newest is None else max(newest, ms)
        return newest

    def check_reconciled(self, actor: str, keys: Any, args: Any) -> None:
        """An attempt is failed as missing from its TaskManager's slot report only if that
        TaskManager (the same registration) does not hold it."""
        jm = self.jm_instances.get(actor)
        if jm is None:
            return
        for _, raw, _ in committed_events(args):
            raw = raw if isinstance(raw, bytes) else str(raw).encode()
            if b"no longer holds it" not in raw:  # (decoded only if it may be one)
                continue
            ev = decode_bytes(raw).event
            if not (isinstance(ev, UpdateTaskExecutionState) and ev.state == TaskState.FAILED
                    and "no longer holds it" in (ev.error or "")):
                continue
            tm = next((p.tm for p in self.tms if p.name == ev.taskmanager), None)
            if tm is not None and f"{ev.job_id}/{ev.execution_id}" in tm.tasks:
                raise Violation(f"{actor} failed {ev.job_id}/{ev.execution_id} as missing from the slot report of "
                                f"{ev.taskmanager}, which holds it")

    def task_started(self, task: SimTask) -> None:
        other = self.live.get(task.key)
        if other is not None and not other.done:
            raise Violation(f"{task.name} starts while the same attempt runs as {other.name}")
        self.live[task.key] = task

    def task_ended(self, task: SimTask, why: str) -> None:
        self.ended_tasks = True
        if self.live.get(task.key) is task:
            del self.live[task.key]
        self.note(f"{task.name} ended: {why}")

    def task_finished(self, task: SimTask) -> None:
        pass

    def fence_check(self, actor: str, fence_key: str, epoch: int, call: Any) -> None:
        """A deposed leader's write never lands: a commit at an epoch below its tag's fence
        (as it stands when the commit runs) must be refused."""
        if self.store.down:
            return
        peek = MemoryBackend(self.store, name="fence-check")
        fence = peek.get(fence_key)
        if fence is not None and epoch < int(fence):
            self.fenced.append((actor, fence_key, epoch, int(fence)))

    def sent_by_taskmanager(self, tm: str, fields: Any) -> None:
        """A TaskManager never reports an attempt that runs on it as having failed to start
        (a repeated SubmitTask once cost restarts that way)."""
        from sluice.events import TaskOperationResult, decode_bytes

        raw = fields.get(b"e") if isinstance(fields, dict) else None
        if raw is None or b"TaskOperationResult" not in raw:
            return
        ev = decode_bytes(raw).event
        if isinstance(ev, TaskOperationResult) and not ev.success:
            proc = self._tm(tm)
            held = [t for t in proc.slots.tasks.values()  # type: ignore[attr-defined]
                    if not t.done and (t.d.job_id, t.d.execution_id) == (ev.job_id, ev.execution_id)]
            if held:
                raise Violation(f"{tm} reports that {ev.execution_id} of {ev.job_id} failed to start "
                                f"({ev.message}) while it runs there")

    def check_errors(self, proc: JMProcess) -> None:
        if proc.jm.errors:
            exc = proc.jm.errors[0]
            text = "".join(traceback.format_exception(exc)).strip().splitlines()
            raise Violation(f"{proc.name} survived an unexpected error (a bug): {text[-1]}\n" + "\n".join(text[-12:]))

    def log_line(self, line: Any) -> None:
        self.notes.append(_Line(self.steps, self.world.elapsed_ms, line))

    def interleave(self, actor: str, owner: Any) -> None:
        """Other processes run while ``owner`` waits inside a call (a pause at any point)."""
        if owner is None:
            return
        self.depth += 1
        try:
            self.note(f"{actor}: paused inside a call while others run")
            for _ in range(self.rng.randint(1, 40)):
                self.world.advance(self.rng.randint(0, 60))
                self._one_step(exclude=owner)
        finally:
            self.depth -= 1

    def freeze_inside(self, actor: str, owner: Any) -> None:
        """``owner`` freezes whole (its lease renewal too) inside a call for longer than its
        lease, while others run: a leader resumes deposed and finishes the call (its read)."""
        if owner is None:
            return
        self.depth += 1
        until = self.world.now + self.rng.choice((LEASE_MS + 200, 2 * LEASE_MS, 4 * LEASE_MS))
        owner.paused_until = max(owner.paused_until, until)
        try:
            self.note(f"{actor}: frozen inside a call for {until - self.world.now} ms while others run")
            while self.world.now < until:
                self._one_step(exclude=owner)
        finally:
            self.depth -= 1

    # --- the run ------------------------------------------------------------------------

    def run(self) -> Outcome:
        try:
            for _ in range(self.cfg.fault_steps):
                self._tick()
            self.faulting = False
            self.note("faults stop")
            for p in self.processes:
                p.paused_until = 0
            deadline = self.world.now + self.cfg.settle_ms
            while self.world.now < deadline:
                self._tick()
                if self.steps % 20 == 0 and self._settled():
                    break
            else:
                self.observer.catch_up()
                hanging = {j.job_id: (self.observer.jobs.jobs[j.job_id].status.value
                                      if j.job_id in self.observer.jobs.jobs else "not registered")
                           for j in self.sim_jobs if not self.observer.ended(j.job_id)}
                raise Violation(f"jobs did not end within {self.cfg.settle_ms // 1000} s after the faults stopped: "
                                f"{hanging}")
            self._final_checks()
            return self._outcome(None)
        except Violation as exc:
            return self._outcome(str(exc))

    def _settled(self) -> bool:
        self.observer.catch_up()
        return all(self.observer.ended(j.job_id) for j in self.sim_jobs)

    def _tick(self) -> None:
        self.steps += 1
        if self.faulting:
            self._world_faults()
        self._one_step()
        if self.steps % self.cfg.check_every == 0:
            self._check()

    def _one_step(self, exclude: Any = None) -> None:
        now = self.world.now
        for jm in self.jms:  # renewal threads run when due
            if jm.renewal_due(now):
                self._run_call(jm, jm.renew)
        # (Process.runnable and SimTask.runnable, inlined: this runs at every step)
        actors: list[Any] = [p for p in self.processes
                             if p is not exclude and now >= p.paused_until and now >= p.wake_at]
        # A task's worker is a process of its own: it goes on while its TaskManager is paused
        # (and so becomes a stale attempt when that TaskManager is declared lost).
        actors += [t for t in self.tasks if t is not exclude and not t.done and now >= t.busy_until]
        actors += [e for e in self.executors if e.queue and not e.closed]
        if not actors:
            self.world.advance(self.rng.randint(5, 50))
            return
        actor = self.rng.choice(actors)
        did = self._run(actor)
        self.world.advance(self.rng.randint(0, 3) if did else self.rng.randint(2, 25))
        if self.ended_tasks:  # (only tasks still going are ever looked at)
            self.ended_tasks = False
            self.tasks = [t for t in self.tasks if not t.done]

    def _tm(self, name: str) -> Process:
        return next(p for p in self.tms if p.name == name)

    def _run(self, actor: Any) -> bool:
        return self._run_call(actor, actor.step)

    def _run_call(self, actor: Any, call: Callable[[], Any]) -> bool:
        try:
            return bool(call())
        except Crash:
            self._crash(actor)
            return True
        except Violation:
            raise
        except RedisUnavailable:
            return True
        except Exception as exc:
            text = "".join(traceback.format_exception(exc)).strip().splitlines()
            raise Violation(f"{getattr(actor, 'name', actor)} raised {type(exc).__name__}: {exc}\n"
                            + "\n".join(text[-30:])) from None

    def _crash(self, actor: Any) -> None:
        if isinstance(actor, SimTask):
            self.note(f"{actor.name}: its worker dies")
            actor.slots.crash_worker(actor.slot)
        elif isinstance(actor, Process):
            self.note(f"{actor.name} dies and restarts")
            actor.crash()

    def _world_faults(self) -> None:
        rng, f = self.rng, self.faults
        if f.hit(rng, "crash", 0.002):
            victims: list[Any] = [p for p in self.processes if not isinstance(p, ClientProcess)]
            victims += [t for t in self.tasks if not t.done and t.started]
            self._crash(rng.choice(victims))
        if f.hit(rng, "pause", 0.003):
            running = [t for t in self.tasks if t.started and not t.done]
            pause = rng.choice((200, 800, 1500, 3000, 8000))
            if running and rng.random() < 0.3:  # a worker process freezes (a long GC, a stuck read)
                task = rng.choice(running)
                task.busy_until = max(task.busy_until, self.world.now + pause)
                self.note(f"{task.name} paused for {pause / 1000:.1f} s")
            else:
                p = rng.choice(self.processes[:-1])
                p.paused_until = self.world.now + pause
                self.note(f"{p.name} paused for {pause / 1000:.1f} s")
                if isinstance(p, TMProcess) and rng.random() < 0.5:  # the whole host freezes (a paused VM)
                    for task in running:
                        if task.slots.tm == p.name:
                            task.busy_until = max(task.busy_until, p.paused_until)
                    self.note(f"the host of {p.name} freezes with it: its workers too")
        if f.hit(rng, "clock_jump", 0.002):
            ms = rng.choice((300, 700, 1500, 4000))
            self.world.advance(ms)
            self.note(f"the clock jumps {ms} ms")
        rate = f.rates.get("clock_skew")
        if rate is not None and self.clocks and self.clock_rng.random() < 0.004 * rate:
            host = self.clock_rng.choice(sorted(self.clocks))
            ms = self.clock_rng.choice((40, 300, 1500, 5000)) * self.clock_rng.choice((-1, 1))
            self.clocks[host].offset_ms += ms
            self.note(f"the wall clock of {host} steps {ms:+} ms (now {self.clocks[host].offset_ms:+} ms off)")
        if f.hit(rng, "redis_restart", 0.0008):
            self.store.crash(None)
            self.note("Redis restarts (nothing lost)")
        if f.hit(rng, "redis_lose", 0.0008):
            lose = rng.randint(0, 1000)
            self.store.crash(self.world.now - lose)
            self.epochs = {e: w for e, w in self.epochs.items() if w[1] <= self.world.now - lose}
            self.decided = {s: d for s, d in self.decided.items() if d[2] <= self.world.now - lose}
            # a delivery the loss undid (with the clobber that destroyed it) is delivered again
            self.clobbered = {k: v for k, v in self.clobbered.items()
                              if entry_order(v[1])[0] <= self.world.now - lose}
            self.note(f"Redis restarts and loses its last {lose} ms of writes")
            for tm in self.tms:  # the leader may deploy again an attempt whose facts were lost
                tm.slots.attempts = {t.key for t in tm.slots.tasks.values() if not t.done}
        if f.hit(rng, "redeliver", 0.01):
            self._redeliver()
        if f.hit(rng, "tm_back_same_session", 0.002):
            self.comebacks.strike(self)
        if self.skew is not None and f.hit(rng, "schema_skew", 0.002):  # the newer one restarts (a rolling upgrade)
            self._crash(self.jms[0])

    def _redeliver(self) -> None:
        tags = [self.keys.cluster] + [self.keys.job(j) for j in self.observer.registered]
        tag = self.rng.choice(tags)
        try:
            Deliverer(self.connect("recovery"), tag).deliver(batch=self.rng.choice((1, 3, 500)))
            self.note(f"recovery delivers the outbox of {tag}")
        except (RedisUnavailable, Crash):
            pass

    # --- checks -------------------------------------------------------------------------

    def _check(self) -> None:
        self.observer.catch_up()
        for job_id, run in self.observer.jobs.jobs.items():
            check_kvstate(job_id, run)
        if simjobs.VIOLATIONS:
            raise Violation(simjobs.VIOLATIONS[0])
        for proc in self.jms:
            self.check_errors(proc)
        if self.skew is not None:
            self.skew.check(self)
        self.comebacks.check(self)
        fields, _ = self.observer.reader.hgetall_with_ttl(self.keys.leader)
        holder, epoch = fields.get(b"holder", b"").decode(), int(fields.get(b"epoch", b"0"))
        leader = next((p.jm for p in self.jms if p.jm.leading and p.jm.id == holder and p.jm.epoch == epoch), None)
        # A leader that has not yet seen a restart of Redis may be ahead of what the log kept:
        # it finds out at its next write, and rebuilds.
        if leader is not None and leader.committer.server == self.store.run_id:
            # Jobs that ended leave the leader's memory (archived in its snapshots), jobs it is
            # still rebuilding are not in it yet (nor the slots they hold): the rest must match.
            recovering = set(leader.recovering)
            pool = SlotPool()
            for tm, slot, job_id, eid in self.observer.jobs.pool.holders():
                if job_id not in recovering:
                    pool.take(tm, slot, job_id, eid)
            logged_jobs = JobsState({j: run for j, run in self.observer.jobs.jobs.items() if j in leader.state.jobs.jobs},
                                    pool)
            for job_id, run in self.observer.jobs.jobs.items():
                if job_id not in leader.state.jobs.jobs and run.status not in TERMINAL_JOB and job_id not in recovering:
                    raise Violation(f"job {job_id} is {run.status.value} in the log, but not in the leader's state")
                if job_id in leader.state.jobs.jobs and job_id in recovering:
                    raise Violation(f"job {job_id} is in the leader's state while it is still being rebuilt")
            live, logged = normal_jobs(leader.state.jobs), normal_jobs(logged_jobs)
            if live != logged:
                raise Violation("the leader's state differs from the replay of the log:\n" + _diff(live, logged))
            if normal_membership(leader.state.membership) != normal_membership(self.observer.membership):
                raise Violation("the leader's membership differs from the replay of the log:\n" + _diff(
                    normal_membership(leader.state.membership), normal_membership(self.observer.membership)))

    def _final_checks(self) -> None:
        self._check()
        check_outboxes(self)
        leader = next((p.jm for p in self.jms if p.jm.leading and p.jm.replay is None
                       and p.jm.committer.server == self.store.run_id), None)
        if leader is not None:  # (a leader that has not yet seen a restart of Redis may be behind)
            check_retention(self, leader)
        for job in self.sim_jobs:
            run = self.observer.jobs.jobs.get(job.job_id)
            if run is not None:
                check_job_result(self, job, run)
        try:
            self._check_tables()
        except Violation:
            raise
        except Exception as exc:
            raise Violation(f"projecting the log failed: {type(exc).__name__}: {exc}") from None

    def _check_tables(self) -> None:
        """The projector's tables equal the tables of a replay of the log."""
        from sluice.services.projector.core import JOB_PROJECTIONS, PROJECTIONS
        from sluice.store import ReadModels

        proj = self.projector.projector
        log = self.connect("checker")
        proj.log = log
        proj.tables = ReadModels(log)
        if not self.projector.loaded:  # a call failed (maybe after it took effect): it reloads first, as its loop does
            proj.load()
        proj.catch_up()
        tables = ReadModels(log)
        keys = self.keys
        for projection in PROJECTIONS:
            state = projection.initial()
            for _, env in log.replay(keys.facts(keys.cluster)):
                projection.evolve(state, env)
            _, rows = tables.read(keys.cluster, projection.name)
            want = {k: projection.row(state, k) for k in rows}
            if rows != want:
                raise Violation(f"table {projection.name} differs from the replay of the log:\n" + _diff(rows, want))
        for job_id in self.observer.registered:
            tag = keys.job(job_id)
            for projection in JOB_PROJECTIONS:
                state = projection.initial()
                for _, env in log.replay(keys.facts(tag)):
                    projection.evolve(state, env)
                _, rows = tables.read(tag, projection.name)
                want = {k: projection.row(state, k) for k in rows}
                if rows != want:
                    raise Violation(f"table {projection.name} of {job_id} differs from the replay of the log:\n"
                                    + _diff(rows, want))

    def _outcome(self, violation: str | None) -> Outcome:
        jobs = {}
        for j in self.sim_jobs:
            run = self.observer.jobs.jobs.get(j.job_id)
            jobs[j.job_id] = run.status.value if run else "not registered"
        trace = ""
        if violation is not None:
            from .trace import render

            trace = render(self, violation)
        facts = sum(self.store.length(s) for s in self.store.streams() if s == self.keys.facts(tag_of(s)))
        return Outcome(self.cfg.seed, violation is None, violation, self.steps, self.world.elapsed_ms, facts,
                       sorted(self.faults.rates), jobs, trace)


def _diff(a: dict, b: dict) -> str:
    lines = []
    for k in sorted(set(a) | set(b), key=str):
        if a.get(k) != b.get(k):
            lines.append(f"  {k}:\n    live:   {str(a.get(k))[:400]}\n    replay: {str(b.get(k))[:400]}")
    return "\n".join(lines[:6])


class _Line:
    """A component's log line in the notes, rendered only if a trace shows it (most seeds
    pass, and formatting every line cost more than the step that logged it)."""

    __slots__ = ("step", "elapsed_ms", "line")

    def __init__(self, step: int, elapsed_ms: int, line: Any) -> None:
        self.step, self.elapsed_ms, self.line = step, elapsed_ms, line

    def __str__(self) -> str:
        return f"step {self.step:>5} t={self.elapsed_ms / 1000:8.3f}s  | {self.line}"

    def __radd__(self, other: str) -> str:
        return other + str(self)


class _Rendered:
    """A structlog event, rendered as ConsoleRenderer would when it is shown."""

    __slots__ = ("event",)
    _render: Any = None

    def __init__(self, event: Any) -> None:
        self.event = event

    def __str__(self) -> str:
        import structlog

        if _Rendered._render is None:
            _Rendered._render = structlog.dev.ConsoleRenderer(colors=False,
                                                              exception_formatter=structlog.dev.plain_traceback)
        return str(_Rendered._render(None, "", dict(self.event)))


def _defer(logger: Any, name: str, event: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return (_Rendered(event),), {}


class _Notes:
    """structlog's output inside the simulation: a line in the running world's notes."""

    current: Simulation | None = None

    def msg(self, message: Any) -> None:
        if _Notes.current is not None:
            _Notes.current.log_line(message)

    log = debug = info = warn = warning = error = critical = exception = fatal = msg


def quiet_logging() -> None:
    """Route the components' log lines into the simulation's notes (shown in a failing
    seed's trace) instead of stderr."""
    import logging

    import structlog

    structlog.configure(
        processors=[structlog.processors.add_log_level, _defer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        logger_factory=lambda *args: _Notes(),
        cache_logger_on_first_use=False,
    )


def run_seed(seed: int, **kwargs: Any) -> Outcome:
    sim = Simulation(SimConfig(seed, **kwargs))
    _Notes.current = sim
    try:
        return sim.run()
    finally:
        _Notes.current = None
        shutil.rmtree(sim.home, ignore_errors=True)
