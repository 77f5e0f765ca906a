"""The run's jobs: the workload job kept running while strikes land (a new instance is
submitted when the last one ended), each one's sink compared with the plain-Python result."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from sluice.client import Client, JobFile, load_job
from sluice.errors import RedisUnavailable
from sluice.events import JobStatus, SubmitJob
from sluice.services.jobs.state import TERMINAL_JOB, JobRun

from .cluster import ChaosCluster, poll
from .workload import JOB_FILE, Row, read_output

__all__ = ["Jobs", "Submitted"]

JOB_TIMEOUT_S = 600.0


@dataclass
class Submitted:
    job_id: str
    output: Path
    file: JobFile
    at: float = field(default_factory=time.monotonic)
    resubmitted: int = 0
    status: str = "SUBMITTED"
    restarts: int = 0
    took_s: float | None = None


@dataclass
class Jobs:
    cluster: ChaosCluster
    input: Path
    expected: list[Row]
    outputs: Path
    submitted: list[Submitted] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def _job(self, job_id: str) -> JobRun | None:
        # A fresh fold every time: after a Redis restart that lost writes, the stream is shorter.
        return Client(self.cluster.log).job(job_id, missing_ok=True)

    def submit(self) -> Submitted:
        n = len(self.submitted) + 1
        output = self.outputs / f"job-{n}"
        job_file = load_job(JOB_FILE, {"input": str(self.input), "output": str(output)})
        job_id = poll(lambda: Client(self.cluster.log).submit(job_file), 60)
        if job_id is None:
            raise RedisUnavailable("could not submit the chaos job within 60 s")
        s = Submitted(job_id, output, job_file)
        self.submitted.append(s)
        return s

    def _pending_submission(self, job_id: str) -> bool:
        inbox = self.cluster.log.keys.inbox(self.cluster.log.keys.cluster)
        return any(
            isinstance(env.event, SubmitJob) and env.event.job_id == job_id for _, env in self.cluster.log.replay(inbox)
        )

    def status(self, s: Submitted) -> JobRun | None:
        """The job as its facts tell it. A job that neither has facts nor waits in the cluster
        inbox was lost with the last second of a Redis that restarted (everysec): the client
        submits it again, as the README says."""
        job = self._job(s.job_id)
        if job is None and time.monotonic() - s.at > 10 and not self._pending_submission(s.job_id):
            Client(self.cluster.log).submit(s.file, job_id=s.job_id)
            s.resubmitted += 1
            s.at = time.monotonic()
        return job

    def running(self, s: Submitted) -> bool:
        job = self.status(s)
        return job is not None and (job.status == JobStatus.RUNNING or job.status in TERMINAL_JOB)

    def ended(self, s: Submitted) -> JobRun | None:
        job = self.status(s)
        return job if job is not None and job.status in TERMINAL_JOB else None

    def ensure_running(self) -> None:
        """A job runs now: the last one if it has not ended, else a new one (the last one checked)."""
        last = self.submitted[-1] if self.submitted else None
        if last is not None and last.status == "SUBMITTED":
            job = poll(lambda: self.status(last) or "missing", 30)
            if not isinstance(job, JobRun) or job.status not in TERMINAL_JOB:
                return  # still going (or about to be submitted again)
            self.finish(last)
        s = self.submit()
        if not poll(lambda: self.running(s), 120, every=0.2, tick=self.cluster.sample_workers):
            self.failures.append(f"job {s.job_id} did not start running within 120 s")

    def finish(self, s: Submitted) -> None:
        """Wait for the job to end; check it FINISHED and its sink holds exactly the expected rows."""
        job = poll(lambda: self.ended(s), JOB_TIMEOUT_S, every=0.3, tick=self.cluster.sample_workers)
        if job is None:
            s.status = "TIMED OUT"
            self.failures.append(f"job {s.job_id} did not end within {JOB_TIMEOUT_S:.0f} s")
            return
        s.status, s.restarts = job.status.value, job.restarts
        s.took_s = ((job.ended_at or job.submitted_at) - job.submitted_at) / 1000
        if job.status != JobStatus.FINISHED:
            self.failures.append(f"job {s.job_id} ended {job.status.value}: {(job.reason or '')[:500]}")
            return
        got = read_output(s.output)
        if got != self.expected:
            self.failures.append(
                f"job {s.job_id}: the sink {s.output} differs from the plain-Python result: "
                + describe(got, self.expected)
            )

    def finish_all(self) -> None:
        for s in self.submitted:
            if s.status == "SUBMITTED":
                self.finish(s)


def describe(got: list[Row], want: list[Row]) -> str:
    g, w = set(got), set(want)
    dup = len(got) - len(g)
    return (
        f"{len(got)} rows (want {len(want)}); {len(g - w)} unexpected e.g. {sorted(g - w)[:3]}; "
        f"{len(w - g)} missing e.g. {sorted(w - g)[:3]}; {dup} duplicated; words {sum(r[1] for r in got)} "
        f"(want {sum(r[1] for r in want)}), occurrences {sum(r[0] * r[1] for r in got)} "
        f"(want {sum(r[0] * r[1] for r in want)})"
    )
