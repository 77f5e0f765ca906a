"""The simulated user: it submits the seed's jobs (again, if a restart of Redis lost a
submission), cancels some, and sends hostile messages (malformed, forged, misaddressed
events, and inboxes clobbered by someone else's write)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

from sluice.client import Client, JobFile
from sluice.errors import JobNotFound, RedisUnavailable, WrongType
from sluice.events import (
    Envelope,
    RegisterTaskManager,
    SubmitJob,
    TaskManagerHeartbeat,
)

from . import jobs as simjobs
from .actors import Process

if TYPE_CHECKING:
    from .cluster import Simulation

__all__ = ["ClientProcess"]


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
                    self.api.submit(
                        JobFile(Path("sim.py"), simjobs.CODE, digest, "sim_job", None, job.graph, {}), job_id=job.job_id
                    )
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

            self.clobber(
                *rng.choice(
                    [
                        (cluster, JM_GROUP),
                        (keys.inbox(keys.job(job.job_id)), JM_GROUP),
                        *((keys.inbox(keys.taskmanager(p.name)), TM_GROUP) for p in sim.tms),
                    ]
                )
            )
            return
        if kind == 0:
            env = Envelope(RegisterTaskManager(bad_id, "s", "h", 1, 1, 1), sim.world.new_id(), 0, sim.world.now)
        elif kind == 1:
            env = Envelope(TaskManagerHeartbeat(bad_id, "s", 1, 0), sim.world.new_id(), 0, sim.world.now)
        elif kind == 2:
            reply = rng.choice(("no-tag", keys.inbox(keys.job(job.job_id)), "{other:client:x}:inbox", bad_id))
            env = Envelope(
                SubmitJob("h" + sim.world.new_id()[:6], job.graph, "0" * 64, "m", reply, {}),
                sim.world.new_id(),
                0,
                sim.world.now,
            )
        elif kind == 3:
            env = Envelope(
                SubmitJob(bad_id, job.graph, "0" * 64, "m", keys.inbox(keys.client("c1")), {}),
                sim.world.new_id(),
                0,
                sim.world.now,
            )
        if env is not None:
            self.log.append(cluster, env)
        elif kind == 4:
            self.log.append_raw(
                rng.choice((cluster, keys.inbox(keys.job(job.job_id)))),
                {b"e": rng.choice((b"{not json", b'{"type":"Nope","v":1}', b"\xff"))},
            )
        else:
            from sluice.events import JSON, OperatorEvent, TaskState, UpdateTaskExecutionState

            ev = rng.choice(
                (
                    UpdateTaskExecutionState(job.job_id, "src:99:0", TaskState.FINISHED, None, "src", 99, 0, "tm0", 0),
                    UpdateTaskExecutionState(job.job_id, "nope", TaskState.RUNNING),
                    OperatorEvent(job.job_id, "src", -1, True, JSON({"type": "request-split"}), 0),
                    OperatorEvent(job.job_id, "zzz", 0, True, JSON({}), 0),
                )
            )
            self.log.append(
                keys.inbox(keys.job(job.job_id)), Envelope(ev, sim.world.new_id(), 0, sim.world.now, job.job_id)
            )
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
        sim.watch.destroyed(inbox)
        backend.delete(inbox)
        backend.set(inbox, b"(simulated) someone else's value")
        sim.note(f"client: clobbered {inbox} with a string")

    def crash(self) -> None:
        pass
