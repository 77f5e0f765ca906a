"""The processes of the simulated cluster, as actors of the scheduler: the JobManagers (a
main loop and a lease renewal), the TaskManagers (workers as ``SimSlots``), the projector,
and the coordinators' worker threads (``Executor``). The client is in ``client.py``."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from sluice.errors import RedisUnavailable
from sluice.services.jobmanager import JobManager, Phase
from sluice.services.jobs.core import JobsConfig
from sluice.services.jobs.speculation_config import SpeculationConfig
from sluice.services.membership.core import MembershipConfig
from sluice.services.projector import Projector
from sluice.services.taskmanager.core import RegistrationConfig
from sluice.services.taskmanager.process import TaskManager

from .checks import check_errors
from .config import HEARTBEAT_MS, LEASE_MS, SPECULATION, TIMEOUT_MS
from .tasks import SimSlots

if TYPE_CHECKING:
    from .cluster import Simulation

__all__ = ["Executor", "JMProcess", "Process", "ProjectorProcess", "TMProcess"]


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
        self.jm = JobManager(
            sim.connect(self.name, self),
            world=sim.clock(f"jm{self.index}"),
            jm_id=self.name,
            config=MembershipConfig(HEARTBEAT_MS, TIMEOUT_MS),
            lease_ttl_ms=LEASE_MS,
            jobs_config=JobsConfig(
                slot_timeout_ms=60_000,
                deploy_timeout_ms=3 * TIMEOUT_MS,
                speculation=SPECULATION if sim.cfg.speculation else SpeculationConfig(),
            ),
            max_stall_s=sim.cfg.max_stall_s,
            checkpoint_interval_ms=200,
            storage_root=f"file://{sim.home}/storage",
            replay_page=sim.cfg.replay_page or sim.rng.choice((3, 50, 1000)),
            batch=sim.rng.choice((2, 8, 500)),  # small: a backlog spans several reads
            coordinator_executor=lambda name: Executor(sim, name),
            serve_after_s=sim.rng.choice((0.0, 0.05, None))
            if sim.cfg.serve_after_s == "seed"
            else cast("float | None", sim.cfg.serve_after_s),
            freeze_gc=False,
        )  # process-wide: the JobManagers and the seeds share this process
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
        check_errors(self)
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
        self.tm = TaskManager(
            log,
            resource_id=self.name,
            slots=self.slots_n,
            host=f"host-{self.name}",
            world=sim.clock(self.name),
            runner=self.slots,
            config=RegistrationConfig(50, 400, HEARTBEAT_MS, TIMEOUT_MS),
            home=sim.home / self.name,
        )
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
