"""The Python client: load a job file, submit it, follow it, cancel it."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Literal, overload

from sluice.errors import ConfigError, JobNotFound, JobRefusedError, SluiceError
from sluice.events import CancelJob, Envelope, JobGraph, JobRefused, SubmitJob, Success
from sluice.services.common.world import SYSTEM, World
from sluice.services.jobs.state import TERMINAL_JOB, JobRun, JobsState, evolve
from sluice.services.jobs.validate import validate
from sluice.services.taskmanager.library import load_module
from sluice.store import Blobs, EventLog

__all__ = ["JobFile", "load_job", "Client", "JobNotFound", "JobRefusedError"]


@dataclass(frozen=True)
class JobFile:
    path: Path
    code: bytes
    digest: str
    module_name: str
    module: ModuleType | None
    """The imported job file (None for a made-up one that is only submitted: the simulation's, a benchmark's)."""
    graph: JobGraph
    params: dict[str, str]


def load_job(path: str | Path, params: dict[str, str] | None = None) -> JobFile:
    """Import a job file, build its graph with ``job(params)`` and validate it (importability
    of every transform included), before anything is started or submitted."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"job file {path} does not exist")
    code = path.read_bytes()
    digest = hashlib.sha256(code).hexdigest()
    name = f"sluice_job_{digest[:16]}"
    try:
        module = load_module(path.resolve(), name)
    except Exception as exc:
        raise ConfigError(f"job file {path} cannot be imported: {type(exc).__name__}: {exc}") from exc
    build = getattr(module, "job", None)
    if not callable(build):
        raise ConfigError(f"job file {path} must define a function job(params) that returns a JobGraph")
    params = dict(params or {})
    graph = build(params)
    if not isinstance(graph, JobGraph):
        raise ConfigError(f"job(params) in {path} returned {type(graph).__name__}, not a JobGraph (call .graph())")
    validate(graph, module)
    return JobFile(path, code, digest, name, module, graph, params)


class Client:
    def __init__(self, log: EventLog, client_id: str | None = None, *, world: World = SYSTEM) -> None:
        self.log = log
        self.keys = log.keys
        self.world = world
        self.id = client_id or world.new_id()[:12]
        self.inbox = self.keys.inbox(self.keys.client(self.id))
        self._positions: dict[str, str] = {}
        self._jobs = JobsState()

    def submit(self, job: JobFile, *, job_id: str | None = None) -> str:
        job_id = job_id or self.world.new_id()[:16]
        Blobs(self.log).put(job.code)
        msg = SubmitJob(job_id, job.graph, job.digest, job.module_name, self.inbox, job.params)
        self.log.append(self.keys.inbox(self.keys.cluster),
                        Envelope(msg, self.world.new_id(), 0, self.world.now_ms(), job_id))
        return job_id

    def wait_accepted(self, job_id: str, timeout: float = 60.0, poll=None) -> None:
        """Block until the job's sources run (Success) or it is refused (raises)."""
        deadline = time.monotonic() + timeout
        pos = "0-0"
        while time.monotonic() < deadline:
            for entry_id, env in self.log.replay(self.inbox, pos):
                pos = entry_id
                ev = env.event
                if isinstance(ev, JobRefused) and ev.job_id == job_id:
                    raise JobRefusedError(f"job {job_id} was refused: {ev.reason}")
                if isinstance(ev, Success) and ev.job_id == job_id:
                    return
            job = self.job(job_id, missing_ok=True)
            if job is not None and job.ended_at is not None:
                return
            if poll:
                poll()
            time.sleep(0.05)
        raise SluiceError(f"job {job_id} did not start within {timeout:.0f} s")

    @overload
    def job(self, job_id: str, *, missing_ok: Literal[False] = False) -> JobRun: ...

    @overload
    def job(self, job_id: str, *, missing_ok: bool) -> JobRun | None: ...

    def job(self, job_id: str, *, missing_ok: bool = False) -> JobRun | None:
        """The job's ExecutionGraph, folded from its fact stream (incrementally)."""
        stream = self.keys.facts(self.keys.job(job_id))
        pos = self._positions.get(stream, "0-0")
        for entry_id, env in self.log.replay(stream, pos):
            evolve(self._jobs, env)
            pos = entry_id
        self._positions[stream] = pos
        job = self._jobs.jobs.get(job_id)
        if job is None and not missing_ok:
            raise JobNotFound(f"job not found: {job_id} (no such job in this cluster; `sluice list` shows the jobs)")
        return job

    def cancel(self, job_id: str, reason: str = "cancelled by the user") -> None:
        self.job(job_id)
        self.log.append(self.keys.inbox(self.keys.job(job_id)),
                        Envelope(CancelJob(job_id, reason), self.world.new_id(), 0, self.world.now_ms(), job_id))

    def checkpoint(self, job_id: str, *, timeout: float = 30.0) -> list:
        """Ask the leader to checkpoint the job's coordinators now; the checkpoints taken."""
        from sluice.events import CoordinatorCheckpointed, TriggerCheckpoint

        job = self.job(job_id)
        if job.status in TERMINAL_JOB:
            raise SluiceError(f"job {job_id} is {job.status.value}: its coordinators are gone")
        stream = self.keys.facts(self.keys.job(job_id))
        start = self.log.last_id(stream) or "0-0"
        self.log.append(self.keys.inbox(self.keys.job(job_id)),
                        Envelope(TriggerCheckpoint(job_id), self.world.new_id(), 0, self.world.now_ms(), job_id))
        from sluice.services.coordination.runtime import has_coordinator

        wanted = {v.name for v in job.graph.vertices if has_coordinator(v)}
        taken: dict[str, object] = {}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for entry_id, env in self.log.replay(stream, start):
                start = entry_id
                if isinstance(env.event, CoordinatorCheckpointed):
                    taken[env.event.operator_id] = env.event
            if set(taken) >= wanted:
                return list(taken.values())
            time.sleep(0.05)
        raise SluiceError(f"job {job_id}: no checkpoint of {', '.join(sorted(wanted - set(taken)))} within "
                          f"{timeout:.0f} s: is a JobManager leading?")

    def job_ids(self) -> list[str]:
        from sluice.events import JobRegistered

        return [env.event.job_id for _, env in self.log.replay(self.keys.facts(self.keys.cluster))
                if isinstance(env.event, JobRegistered)]
