"""A private cluster for benchmarks: redis-server, a JobManager and TaskManagers as processes."""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from sluice.client import Client, JobFile
from sluice.events import JobGraph, JobStatus
from sluice.services.embedded import RedisServer
from sluice.services.jobs.state import TERMINAL_JOB, JobRun
from sluice.store import EventLog, Keys, connect

__all__ = ["BenchCluster", "NO_SPARK", "finished_run", "job_seconds"]

NO_SPARK = "sc://127.0.0.1:1"
"""The Spark address of a TaskManager that runs only no-op tasks: never reached (and,
unlike a made-up host name, it costs its workers' warm-up no name lookups)."""


@contextlib.contextmanager
def finished_run(home: Path) -> Iterator[tuple[EventLog, JobRun]]:
    """The log and the one job of a finished ``sluice run`` in ``home``, its Redis brought back
    on its data directory for the reading (and stopped after)."""
    from sluice.services.embedded import EmbeddedCluster

    cluster = EmbeddedCluster(home)
    log = EventLog(connect(cluster.redis_url()), Keys("sluice"))
    try:
        client = Client(log)
        (job_id,) = client.job_ids()
        yield log, client.job(job_id)
    finally:
        cluster.stop_redis()


class BenchCluster:
    def __init__(self, home: Path, prefix: str = "bench") -> None:
        self.home = home
        self.prefix = prefix
        self.redis = RedisServer(None)
        self.procs: list[subprocess.Popen] = []
        self.url = ""
        self._log: EventLog | None = None

    @property
    def log(self) -> EventLog:
        """The cluster's log (once the cluster is entered: ``with BenchCluster(...) as cluster``)."""
        if self._log is None:
            raise RuntimeError("the bench cluster is not started: use it in a with statement")
        return self._log

    def __enter__(self) -> BenchCluster:
        self.url = self.redis.start()
        self._log = EventLog(connect(self.url), Keys(self.prefix))
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        self.redis.stop()

    def spawn(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        self.home.mkdir(parents=True, exist_ok=True)
        log = open(self.home / f"proc-{len(self.procs)}.log", "wb")
        cmd = [
            sys.executable,
            "-m",
            "sluice",
            "--redis",
            self.url,
            "--prefix",
            self.prefix,
            "--home",
            str(self.home),
            *args,
        ]
        p = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "SLUICE_LOG_LEVEL": "WARNING", **(env or {})}
        )
        self.procs.append(p)
        return p

    def wait_registered(self, n: int, timeout: float = 60) -> None:
        from sluice.services.membership.core import Membership, evolve

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = Membership()
            for _, env in self.log.replay(self.log.keys.facts(self.log.keys.cluster)):
                evolve(state, env)
            if len(state.active()) >= n:
                return
            time.sleep(0.1)
        raise RuntimeError(f"{n} TaskManagers did not register within {timeout} s; see {self.home}")

    def start(
        self, resource_id: str, slots: int, spark: str, env: dict[str, str] | None = None
    ) -> tuple[subprocess.Popen, subprocess.Popen]:
        """A JobManager and one TaskManager whose workers use the Spark server ``spark``
        (``env`` added to the TaskManager's environment), registered."""
        jm = self.spawn("jobmanager")
        tm = self.spawn("taskmanager", "--resource-id", resource_id, "--slots", str(slots), "--spark", spark, env=env)
        self.wait_registered(1)
        return jm, tm

    def add_taskmanager(
        self, resource_id: str, slots: int, spark: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen:
        """One more TaskManager (after ``start``), registered with the ones before it."""
        known = len(self.procs) - 1  # the JobManager, then TaskManagers
        tm = self.spawn("taskmanager", "--resource-id", resource_id, "--slots", str(slots), "--spark", spark, env=env)
        self.wait_registered(known + 1)
        return tm

    def start_noop(self, resource_id: str, slots: int) -> tuple[subprocess.Popen, subprocess.Popen]:
        """A JobManager and one TaskManager for no-op tasks (no Spark), registered, its slot
        workers given time to start (imports) before a clock runs."""
        procs = self.start(resource_id, slots, NO_SPARK)
        time.sleep(2.0)
        return procs

    def run_noop_job(self, graph: JobGraph, *, poll_s: float = 0.01) -> float:
        """Submit a job of no-op vertices (it has no code) and wait for its end: the seconds
        from submission to FINISHED (raises if it ended otherwise)."""
        code = b"# no code: the job is no-op vertices only\n"
        job = JobFile(Path("noop.py"), code, hashlib.sha256(code).hexdigest(), "sluice_bench_noop", None, graph, {})
        t = time.perf_counter()
        self.run_job(job, poll_s=poll_s)
        return time.perf_counter() - t

    def run_job(self, job: JobFile, *, poll_s: float = 0.01, timeout: float = 900.0) -> JobRun:
        """Submit ``job`` and wait for its end; its run (``ended_at - submitted_at`` is its
        time by the log's clock). Raises if it ended other than FINISHED, if a process of
        the cluster died, or after ``timeout`` seconds."""
        client = Client(self.log)
        job_id = client.submit(job)
        client.wait_accepted(job_id)  # raises if refused
        deadline = time.monotonic() + timeout
        while (state := client.job(job_id, missing_ok=True)) is None or state.status not in TERMINAL_JOB:
            dead = [(n, p) for n, p in enumerate(self.procs) if p.poll() is not None]
            if dead:
                n, p = dead[0]
                raise RuntimeError(
                    f"a process of the bench cluster exited with code {p.returncode} while job "
                    f"{job_id} ran; see its log, {self.home / f'proc-{n}.log'}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"job {job_id} ({job.graph.name}) has not ended after {timeout:g} s; see {self.home}"
                )
            time.sleep(poll_s)
        if state.status != JobStatus.FINISHED:
            raise RuntimeError(f"the job {job.graph.name} ended {state.status.value}: {state.reason}")
        return state


def share_env(master: str, slots: int) -> dict[str, str]:
    """The environment that gives a bench cluster's TaskManagers their tasks' share of the
    Spark server (``taskmanager.share``) as ``sluice run`` does: a bench cluster's
    TaskManagers are given the server's URL, so they are told its cores."""
    from sluice.services.taskmanager.share import local_cores

    cores = local_cores(master)
    if cores is None:
        return {"SLUICE_TASK_PARTITIONS": "0"}
    return {"SLUICE_SPARK_CORES": str(cores), "SLUICE_SPARK_SLOTS": str(slots)}


def job_seconds(run: JobRun) -> float:
    """An ended job's time from SubmitJob to its end, by the log's clock."""
    if run.ended_at is None:
        raise ValueError(f"job {run.job_id} has not ended")
    return (run.ended_at - run.submitted_at) / 1000
