"""The Python client: load a job file, submit it, follow it, cancel it."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Literal, TypeVar, overload

from sluice.errors import ConfigError, JobNotFound, JobRefusedError, SluiceError, WrongType
from sluice.errors_display import short_exception
from sluice.events import CancelJob, Envelope, JobGraph, JobPurged, JobRefused, PurgeJob, SubmitJob, Success
from sluice.services.common.world import SYSTEM, World
from sluice.services.jobs.state import TERMINAL_JOB, JobRun, JobsState, evolve
from sluice.services.jobs.validate import validate
from sluice.services.taskmanager.library import load_module
from sluice.store import Blobs, EventLog

__all__ = ["JobFile", "load_job", "Client", "JobNotFound", "JobRefusedError"]

E = TypeVar("E", JobRefused, Success)


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
        raise ConfigError(
            f"job file {path} cannot be imported: {type(exc).__name__}: {exc}\n" + short_exception(exc)
        ) from exc
    build = getattr(module, "job", None)
    if not callable(build):
        raise ConfigError(f"job file {path} must define a function job(params) that returns a JobGraph")
    params = dict(params or {})
    try:
        graph = build(params)
    except Exception as exc:
        raise ConfigError(
            f"job(params) in {path} raised {type(exc).__name__}: {exc} (params: {params})\n" + short_exception(exc)
        ) from exc
    if not isinstance(graph, JobGraph):
        raise ConfigError(f"job(params) in {path} returned {type(graph).__name__}, not a JobGraph (call .graph())")
    validate(graph, module)
    return JobFile(path, code, digest, name, module, graph, params)


class Client:
    def __init__(
        self, log: EventLog, client_id: str | None = None, *, world: World = SYSTEM, refused_wait_s: float = 5.0
    ) -> None:
        self.log = log
        self.refused_wait_s = refused_wait_s
        """How long a message an inbox refuses is sent again before giving up (an inbox whose
        key holds another kind of value is moved aside first: refused, it was written again)."""
        self.keys = log.keys
        self.world = world
        self.id = client_id or world.new_id()[:12]
        self.inbox = self.keys.inbox(self.keys.client(self.id))
        self._positions: dict[str, str] = {}
        self._jobs = JobsState()
        self._inbox_pos = "0-0"
        self._replies: list[JobRefused | Success] = []

    def submit(self, job: JobFile, *, job_id: str | None = None) -> str:
        job_id = job_id or self.world.new_id()[:16]
        Blobs(self.log).put(job.code)
        msg = SubmitJob(job_id, job.graph, job.digest, job.module_name, self.inbox, job.params)
        self._send(
            self.keys.inbox(self.keys.cluster), Envelope(msg, self.world.new_id(), 0, self.world.now_ms(), job_id)
        )
        return job_id

    def _send(self, inbox: str, env: Envelope) -> None:
        deadline = time.monotonic() + self.refused_wait_s
        while True:
            try:
                self.log.append(inbox, env)
                return
            except WrongType:
                if time.monotonic() >= deadline:
                    raise WrongType(
                        f"{inbox} holds another kind of value than a stream again each time it is moved aside "
                        "(something other than Sluice keeps writing that key): stop whatever writes it, and "
                        "send again"
                    ) from None
                time.sleep(0.1)

    def wait_accepted(self, job_id: str, timeout: float = 60.0, poll: Callable[[], object] | None = None) -> JobRun:
        """Block until the JobManager accepted the job: its ExecutionGraph exists (JobSubmitted
        in its facts), before any task is deployed. JobRefusedError if it was refused;
        SluiceError if no JobManager answered within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            self._check_refused(job_id)
            job = self.job(job_id, missing_ok=True)
            if job is not None:
                return job
            if time.monotonic() >= deadline:
                raise SluiceError(
                    f"no JobManager accepted or refused job {job_id} within {timeout:g} s: is one running and "
                    "leading (`sluice status`)? The submission waits in the cluster's inbox: a JobManager that "
                    f"starts takes it in, and `sluice status {job_id}` shows it then"
                )
            if poll:
                poll()
            time.sleep(0.05)

    def wait_running(self, job_id: str, timeout: float = 60.0, poll: Callable[[], object] | None = None) -> JobRun:
        """Block until every source subtask of the job runs (the leader's Success: the job is
        RUNNING), or the job ended. With more subtasks than free slots that is only once the
        first ones finished. Raises as ``wait_accepted`` does, and SluiceError if the job was
        accepted but does not run within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        job = self.wait_accepted(job_id, timeout, poll)
        while not self._answers(job_id, Success) and job.ended_at is None:
            if time.monotonic() >= deadline:
                raise SluiceError(
                    f"job {job_id} was accepted but its sources do not all run after {timeout:g} s "
                    f"({job.status.value}): not enough free slots? `sluice status` shows the TaskManagers, "
                    f"`sluice status {job_id}` the job's tasks"
                )
            if poll:
                poll()
            time.sleep(0.05)
            job = self.job(job_id)
        return job

    def wait_ended(self, job_id: str, timeout: float | None = None, poll: Callable[[], object] | None = None) -> JobRun:
        """Block until the job is FINISHED, FAILED or CANCELED (it must exist: ``wait_accepted``
        first); SluiceError after ``timeout`` seconds if one is given."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (job := self.job(job_id)).status not in TERMINAL_JOB:
            if deadline is not None and time.monotonic() >= deadline:
                raise SluiceError(f"job {job_id} has not ended after {timeout:g} s: it is {job.status.value}")
            if poll:
                poll()
            time.sleep(0.1)
        return job

    def _answers(self, job_id: str, kind: type[E]) -> list[E]:
        """The leader's replies of ``kind`` about ``job_id`` in this client's inbox so far."""
        for entry_id, env in self.log.replay(self.inbox, self._inbox_pos):
            self._inbox_pos = entry_id
            if isinstance(env.event, (JobRefused, Success)):
                self._replies.append(env.event)
        return [ev for ev in self._replies if isinstance(ev, kind) and ev.job_id == job_id]

    def _check_refused(self, job_id: str) -> None:
        for ev in self._answers(job_id, JobRefused):
            raise JobRefusedError(f"job {job_id} was refused: {ev.reason}")

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
        self._send(
            self.keys.inbox(self.keys.job(job_id)),
            Envelope(CancelJob(job_id, reason), self.world.new_id(), 0, self.world.now_ms(), job_id),
        )

    def checkpoint(self, job_id: str, *, timeout: float = 30.0) -> list:
        """Ask the leader to checkpoint the job's coordinators now; the checkpoints taken."""
        from sluice.events import CoordinatorCheckpointed, TriggerCheckpoint

        job = self.job(job_id)
        if job.status in TERMINAL_JOB:
            raise SluiceError(f"job {job_id} is {job.status.value}: its coordinators are gone")
        stream = self.keys.facts(self.keys.job(job_id))
        start = self.log.last_id(stream) or "0-0"
        self._send(
            self.keys.inbox(self.keys.job(job_id)),
            Envelope(TriggerCheckpoint(job_id), self.world.new_id(), 0, self.world.now_ms(), job_id),
        )
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
        raise SluiceError(
            f"job {job_id}: no checkpoint of {', '.join(sorted(wanted - set(taken)))} within "
            f"{timeout:.0f} s: is a JobManager leading?"
        )

    def close(self) -> None:
        """Delete this client's inbox (the replies it was sent) and the marks of what was
        delivered to it: a client done with its jobs leaves no transport behind."""
        self.log.backend.delete(*self.keys.transport(self.keys.client(self.id)))

    def purge(self, job_id: str, *, timeout: float = 30.0) -> JobPurged:
        """Ask the leading JobManager to remove an ended job's keys, leaving its tombstone;
        its ``JobPurged``. JobNotFound for an unknown job, SluiceError if it is not ended
        (or was purged already) or no JobManager answers within ``timeout`` seconds."""
        replies = self.keys.client(self.world.new_id()[:12])  # one reply, read once
        reply_to = self.keys.inbox(replies)
        self._send(
            self.keys.inbox(self.keys.cluster),
            Envelope(PurgeJob(job_id, reply_to), self.world.new_id(), 0, self.world.now_ms(), job_id),
        )
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                for _, env in self.log.replay(reply_to):
                    if isinstance(env.event, JobPurged):
                        return env.event
                    if isinstance(env.event, JobRefused):
                        reason = env.event.reason
                        raise (
                            JobNotFound(reason)
                            if reason.startswith("job not found")
                            else SluiceError(f"purge refused: {reason}")
                        )
                time.sleep(0.05)
        finally:
            self.log.backend.delete(*self.keys.transport(replies))  # read, the reply's transport goes
        raise SluiceError(
            f"no JobManager answered within {timeout:.0f} s: is the cluster running? "
            "(`sluice cluster start`, or `sluice status` to see it)"
        )

    def job_ids(self) -> list[str]:
        from sluice.events import JobRegistered

        return [
            env.event.job_id
            for _, env in self.log.replay(self.keys.facts(self.keys.cluster))
            if isinstance(env.event, JobRegistered)
        ]
