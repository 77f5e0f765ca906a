"""The simulated cluster: its world, the seeded scheduler, faults, and the run of one seed.

Every actor wraps a real component: ``JobManager`` (its main loop and its lease renewal),
``TaskManager`` (with ``SimSlots`` for workers), the ``Projector``, the ``Client``, the
coordinators' worker threads, and the tasks. The scheduler picks one runnable actor a
step; the clock moves a little after every step and jumps when nothing is due. Faults
strike between steps (a crash, a pause, a Redis restart, a clock jump, a client's hostile
message) and inside the actors' calls to the log (``faults.FaultyBackend``).

A run has a fault phase, then faults stop and the world must settle: every job ends
within a bound, and the end-state checks run.

The actors are in ``actors.py`` and ``client.py``, the checks run inside the log's calls
in ``watch.py``, the checks of the whole cluster in ``checks.py``, the routing of log
lines in ``notes.py``, what a run is given and yields in ``config.py``.
"""

from __future__ import annotations

import random
import shutil
import traceback
from collections import deque
from collections.abc import Callable
from typing import Any

from sluice.errors import RedisUnavailable
from sluice.events import Envelope
from sluice.events.envelope import decode_bytes
from sluice.services.jobmanager import JobManager
from sluice.store import Deliverer, EventLog, Keys, tag_of
from sluice.store.memory import MemoryBackend, MemoryStore

from . import jobs as simjobs
from .actors import Executor, JMProcess, Process, ProjectorProcess, TMProcess
from .checks import check, final_checks
from .client import ClientProcess
from .comeback import Comebacks
from .config import LEASE_MS, Outcome, SimConfig, base
from .faults import Crash, Faults, FaultyBackend
from .invariants import Observer, Violation
from .notes import Line, Notes
from .skew import SkewWatch, newer_decode
from .tasks import SimFiles, SimTask
from .watch import Watch
from .world import ProcessClock, SimWorld

__all__ = ["Outcome", "SimConfig", "Simulation", "run_seed"]


class Simulation:
    """One seed's world: its cluster, its scheduler, its faults."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        rng = self.rng
        self.world = SimWorld(random.Random(rng.getrandbits(64)))
        self.faults = cfg.faults if cfg.faults is not None else Faults.swarm(rng)
        self.store = MemoryStore(self.world.now_ms, seed=rng.getrandbits(32), shards=cfg.shards)
        self.watch = Watch(self)
        # appendfsync always (a restart loses nothing) or everysec (it may lose the last second)
        self.store.durable = not self.faults.on("redis_lose") and rng.random() < 0.5
        self.shard_rng = random.Random(f"shards {cfg.seed}")
        """Draws of the shard faults, from a stream of their own (a seed's other draws stay)."""
        if cfg.shards > 1:
            # On a cluster, a failover loses what the replica had not received, whatever the
            # master's appendfsync: no restart keeps every write.
            self.store.durable = False
            if self.faults.rates:  # (a healthy cluster stays healthy)
                self.faults.rates.setdefault("shard_failover", self.shard_rng.choice((0.2, 0.5, 1.0, 2.0)))
        self.keys = Keys("sim")
        self.files = SimFiles()
        self.home = base() / f"seed-{cfg.seed}"  # the TaskManagers' disks: fresh for every run
        shutil.rmtree(self.home, ignore_errors=True)
        self.faulting = True
        self.depth = 0
        self.calls = 0
        self.steps = 0
        self.notes: deque[str | Line] = deque(maxlen=80)
        self.jm_instances: dict[str, JobManager] = {}  # by connection name: every instance ever started
        self.tasks: list[SimTask] = []
        self.ended_tasks = False
        self.executors: list[Executor] = []
        self.live: dict[tuple[str, str], SimTask] = {}
        self.clocks: dict[str, ProcessClock] = {}
        """Each host's clocks, with ``clock_skew`` on (drawn from a stream of their own: the
        seed's other draws stay what they were)."""
        self.clock_rng = random.Random(f"clock_skew {cfg.seed}")
        self.slow_tm = f"tm{rng.randrange(3)}" if self.faults.on("slow_reader") else None
        if cfg.speculation and self.slow_tm is None:
            self.slow_tm = f"tm{random.Random(f'speculation {cfg.seed}').randrange(3)}"
        simjobs.VIOLATIONS.clear()
        self.decode: Callable[[bytes], Envelope] = decode_bytes
        """How every reader but an older JobManager decodes (with ``schema_skew``: as a newer Sluice)."""
        self.skew: SkewWatch | None = None
        if self.faults.on("schema_skew"):
            self.decode, self.skew = newer_decode, SkewWatch()
        self.comebacks = Comebacks()
        n_jm = cfg.jobmanagers or rng.randint(2, 3)
        n_tm = cfg.taskmanagers or (3 if cfg.speculation else rng.randint(1, 3))  # (speculation: another to race on)
        self.sim_jobs = [simjobs.draw_job(rng, i) for i in range(cfg.jobs or rng.randint(1, 2))]
        if cfg.speculation:
            self.sim_jobs = [simjobs.speculatable(j) for j in self.sim_jobs]
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
        return EventLog(
            FaultyBackend(MemoryBackend(self.store, name=name), self, name, owner),
            self.keys,
            decode=decode_bytes if older else self.decode,
        )

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

    def log_line(self, line: Any) -> None:
        self.notes.append(Line(self.steps, self.world.elapsed_ms, line))

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
                hanging = {
                    j.job_id: (
                        self.observer.jobs.jobs[j.job_id].status.value
                        if j.job_id in self.observer.jobs.jobs
                        else "not registered"
                    )
                    for j in self.sim_jobs
                    if not self.observer.ended(j.job_id)
                }
                raise Violation(
                    f"jobs did not end within {self.cfg.settle_ms // 1000} s after the faults stopped: {hanging}"
                )
            final_checks(self)
            return self._outcome(None)
        except Violation as exc:
            return self._outcome(str(exc))

    def _settled(self) -> bool:
        self.observer.catch_up()
        if not all(self.observer.ended(j.job_id) for j in self.sim_jobs):
            return False
        # On shards, a failover after the jobs ended is recovered too before the final checks:
        # until a leader has seen it, an outbox on a shard that kept its writes may be past
        # deliveries the failed shard lost (the leader delivers them again: restarts.rewinds).
        return self.cfg.shards == 1 or any(
            p.jm.leading and p.jm.replay is None and p.jm.committer.server == self.store.identity() for p in self.jms
        )

    def _tick(self) -> None:
        self.steps += 1
        if self.faulting:
            self._world_faults()
        self._one_step()
        if self.steps % self.cfg.check_every == 0:
            check(self)

    def _one_step(self, exclude: Any = None) -> None:
        now = self.world.now
        for jm in self.jms:  # renewal threads run when due
            if jm.renewal_due(now):
                self._run_call(jm, jm.renew)
        # (Process.runnable and SimTask.runnable, inlined: this runs at every step)
        actors: list[Any] = [
            p for p in self.processes if p is not exclude and now >= p.paused_until and now >= p.wake_at
        ]
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
            raise Violation(
                f"{getattr(actor, 'name', actor)} raised {type(exc).__name__}: {exc}\n" + "\n".join(text[-30:])
            ) from None

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
            self.watch.forget_after(self.world.now - lose)
            self.note(f"Redis restarts and loses its last {lose} ms of writes")
            for tm in self.tms:  # the leader may deploy again an attempt whose facts were lost
                tm.slots.attempts = {t.key for t in tm.slots.tasks.values() if not t.done}
        if self.store.shards > 1 and f.hit(self.shard_rng, "shard_failover", 0.0008):
            self._failover()
        if f.hit(rng, "redeliver", 0.01):
            self._redeliver()
        if f.hit(rng, "tm_back_same_session", 0.002):
            self.comebacks.strike(self)
        if self.skew is not None and f.hit(rng, "schema_skew", 0.002):  # the newer one restarts (a rolling upgrade)
            self._crash(self.jms[0])

    def _failover(self) -> None:
        """One shard's master dies; its replica, up to a second behind, takes its place."""
        srng = self.shard_rng
        shard, lose = srng.randrange(self.store.shards), srng.randint(0, 1000)
        self.store.failover(shard, self.world.now - lose)
        self.watch.forget_after(self.world.now - lose)  # (of every shard: it only checks less)
        holds = [t for t in [self.keys.cluster, *(self.keys.job(j) for j in self.observer.registered)]]
        holds = [t for t in holds if self.store.shard_of(t) == shard]
        self.note(
            f"shard {shard} fails over and loses its last {lose} ms of writes (it holds {', '.join(holds) or 'no tag in use'})"
        )
        for tm in self.tms:  # the leader may deploy again an attempt whose facts were lost
            tm.slots.attempts = {t.key for t in tm.slots.tasks.values() if not t.done}

    def _redeliver(self) -> None:
        tags = [self.keys.cluster] + [self.keys.job(j) for j in self.observer.registered]
        tag = self.rng.choice(tags)
        try:
            Deliverer(self.connect("recovery"), tag).deliver(batch=self.rng.choice((1, 3, 500)))
            self.note(f"recovery delivers the outbox of {tag}")
        except (RedisUnavailable, Crash):
            pass

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
        return Outcome(
            self.cfg.seed,
            violation is None,
            violation,
            self.steps,
            self.world.elapsed_ms,
            facts,
            sorted(self.faults.rates),
            jobs,
            trace,
            len(self.observer.speculated),
            len(self.observer.won),
        )


def run_seed(seed: int, **kwargs: Any) -> Outcome:
    sim = Simulation(SimConfig(seed, **kwargs))
    Notes.current = sim
    try:
        return sim.run()
    finally:
        Notes.current = None
        shutil.rmtree(sim.home, ignore_errors=True)
