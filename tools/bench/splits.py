"""Split request -> assignment round trip over the streams, against a raw Redis stream
request/response round trip measured in the same run, on the same server.

    raw           a responder thread: XREADGROUP BLOCK on a request stream, then XADD of the reply
                  to a reply stream + XACK (one pipeline); the client: XADD of the request, then
                  XREAD BLOCK on the reply stream from its last id (orjson both ways)
    Sluice        a subtask's ``TaskEvents.next_split()`` against a JobManager leading in this
                  process: the request goes to the job's inbox, the JobManager decides, the source
                  coordinator answers, and the answer lands in the subtask's inbox in the same
                  fenced commit; by both protocols (operator events, RequestNextInputSplit)

The bench impersonates subtask 0 of a one-vertex range source whose every split is one
number; with no TaskManager the subtask stays CREATED, which the JobManager answers. One
fresh job per protocol. The paths are measured in alternating rounds; the table reports,
for each percentile, the median over the rounds.
"""

from __future__ import annotations

import hashlib
import math
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import cast

import orjson
from rich.table import Table

from sluice.api import Job
from sluice.client import Client, JobFile
from sluice.events import JobRefused, TaskDeploymentDescriptor, TaskSource
from sluice.services.common.shell import configure_logging
from sluice.services.embedded import RedisServer
from sluice.services.jobmanager.process import JobManager
from sluice.services.jobs.core import JobsConfig
from sluice.services.jobs.state import TERMINAL_JOB
from sluice.services.taskmanager.events import TaskEvents
from sluice.store import EventLog, Keys, connect

from .console import console

__all__ = ["run"]


PROTOCOLS = ("operator-events", "input-splits")
_Entries = list[tuple[bytes, dict[bytes, bytes]]]
"""A stream's entries as redis-py returns them here (RESP2, bytes)."""
TARGET = 2.0  # Sluice p50 <= TARGET x raw p50


def percentile(sorted_ns: list[int], q: float) -> float:
    """The q-th percentile (nearest rank) in µs."""
    i = min(len(sorted_ns) - 1, max(0, math.ceil(q / 100 * len(sorted_ns)) - 1))
    return sorted_ns[i] / 1000


# --- raw redis-py request/response ---------------------------------------------------------


class RawPair:
    """A responder thread and a client doing request/response over two streams."""

    GROUP = "responder"

    def __init__(self, url: str, tag: str) -> None:
        self.req, self.rep = tag + ":raw-request", tag + ":raw-reply"
        self.client = connect(url)
        self.server_side = connect(url)
        self.client.delete(self.req, self.rep)
        self.client.xgroup_create(self.req, self.GROUP, id="0", mkstream=True)
        self.last: str | bytes = "0-0"
        self.seq = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._respond, name="bench-raw-responder", daemon=True)
        self.thread.start()

    def _respond(self) -> None:
        r = self.server_side
        while not self.stop.is_set():
            reply = cast(
                "list[tuple[bytes, _Entries]]", r.xreadgroup(self.GROUP, "c", {self.req: ">"}, count=100, block=100)
            )
            if not reply:
                continue
            entries = reply[0][1]
            pipe = r.pipeline(transaction=False)
            for _entry_id, fields in entries:
                body = orjson.loads(fields[b"e"])
                i = body["seq"]
                answer = {
                    "type": "split",
                    "to": body["subtask"],
                    "split": {"format": "range", "start": i, "end": i + 1, "index": i},
                }
                pipe.xadd(self.rep, {b"e": orjson.dumps(answer)})
            pipe.xack(self.req, self.GROUP, *[entry_id for entry_id, _ in entries])
            pipe.execute()

    def request(self) -> dict:
        self.seq += 1
        self.client.xadd(
            self.req, {b"e": orjson.dumps({"type": "request-split", "subtask": 0, "host": "bench", "seq": self.seq})}
        )
        while True:
            reply = cast(
                "list[tuple[bytes, _Entries]]", self.client.xread({self.rep: self.last}, count=1, block=10_000)
            )
            if reply:
                entry_id, fields = reply[0][1][0]
                self.last = entry_id
                return orjson.loads(fields[b"e"])["split"]

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.client.close()
        self.server_side.close()


# --- the Sluice path -----------------------------------------------------------------------


def submit(log: EventLog, protocol: str, n_splits: int, out: Path) -> TaskEvents:
    """Submit a one-vertex range source (one number per split) and return the events of its
    subtask 0, once the JobManager has built the job's ExecutionGraph."""
    j = Job(f"bench-splits-{protocol}", max_parallelism=128)
    j.read_range("nums", 0, n_splits, per_split=1, parallelism=1, protocol=protocol).write_parquet(
        "out", str(out / protocol)
    )
    graph = j.graph()
    (source,) = [v for v in graph.vertices if v.source is not None]
    code = b"# the splits benchmark: nothing runs\n"
    job = JobFile(
        Path("bench_splits.py"), code, hashlib.sha256(code).hexdigest(), "tools.bench.splits", None, graph, {}
    )
    client = Client(log)
    job_id = client.submit(job)
    deadline = time.monotonic() + 30
    while True:
        for _, env in log.replay(client.inbox):
            if isinstance(env.event, JobRefused) and env.event.job_id == job_id:
                raise RuntimeError(f"the benchmark job was refused: {env.event.reason}")
        state = client.job(job_id, missing_ok=True)
        if state is not None and state.status in TERMINAL_JOB:
            raise RuntimeError(f"the benchmark job ended {state.status.value}: {state.reason}")
        if state is not None and state.built:
            ex = state.vertices[source.name].subtasks[0]
            assert ex.attempt == 0 and not ex.state.terminal, ex
            break
        if time.monotonic() > deadline:
            raise RuntimeError("the JobManager did not build the benchmark job's ExecutionGraph within 30 s")
        time.sleep(0.01)
    descriptor = TaskDeploymentDescriptor(
        job_id=job_id,
        execution_id=f"{source.name}:0:0",
        vertex=source.name,
        subtask=0,
        attempt=0,
        parallelism=source.parallelism,
        max_parallelism=graph.max_parallelism,
        kind="source",
        code_blob=job.digest,
        module=job.module_name,
        functions=[],
        params={},
        inputs=[],
        source=TaskSource("range", {}, protocol),
    )
    return TaskEvents(log, descriptor, "bench", answer_timeout_s=30.0)


# --- the run -------------------------------------------------------------------------------


def timed(fn, n: int) -> list[int]:
    out = []
    clock = time.perf_counter_ns
    for _ in range(n):
        t = clock()
        split = fn()
        out.append(clock() - t)
        assert split is not None, "ran out of splits"
    out.sort()
    return out


def run(*, requests: int = 2000, warmup: int = 100, n_rounds: int = 4) -> dict[str, tuple[float, float]]:
    configure_logging("WARNING")  # the JobManager runs in this process: keep its info lines out of the table
    server = RedisServer(None)
    url = server.start()
    stop = threading.Event()
    jm_thread: threading.Thread | None = None
    raw: RawPair | None = None
    try:
        with tempfile.TemporaryDirectory(prefix="sluice-bench-splits-") as home:
            log = EventLog(connect(url), Keys("bench"))
            jm = JobManager(
                log, jobs_config=JobsConfig(slot_timeout_ms=3_600_000), storage_root=Path(home, "storage").as_uri()
            )
            jm_thread = threading.Thread(target=jm.run, args=(stop,), name="bench-jobmanager", daemon=True)
            jm_thread.start()
            raw = RawPair(url, log.keys.cluster)
            per_round = max(requests // n_rounds, 1)
            n_splits = warmup + per_round * n_rounds + 10
            with console.status("submitting the benchmark jobs"):
                tasks = {p: submit(log, p, n_splits, Path(home)) for p in PROTOCOLS}
            paths = [("raw", raw.request)] + [(p, tasks[p].next_split) for p in PROTOCOLS]
            for _, fn in paths:
                timed(fn, warmup)
            samples: dict[str, list[list[int]]] = {name: [] for name, _ in paths}
            with console.status(f"{n_rounds} alternating rounds of {per_round} round trips per path"):
                for _ in range(n_rounds):
                    for name, fn in paths:
                        samples[name].append(timed(fn, per_round))
    finally:
        stop.set()
        if raw is not None:
            raw.close()
        if jm_thread is not None:
            jm_thread.join(timeout=10)
        server.stop()

    results = {
        name: (
            statistics.median(percentile(r, 50) for r in rounds),
            statistics.median(percentile(r, 99) for r in rounds),
        )
        for name, rounds in samples.items()
    }
    raw50, raw99 = results["raw"]
    table = Table(
        title=f"Split request → assignment round trip (µs; median of {n_rounds} alternating rounds × "
        f"{per_round}, after {warmup} warm-up; same server, same run)"
    )
    table.add_column("path")
    for col in ("p50 µs", "p99 µs", "p50/raw", "p99/raw", "target"):
        table.add_column(col, justify="right")
    table.add_row("raw redis-py", f"{raw50:,.0f}", f"{raw99:,.0f}", "1.00", "1.00", "")
    for p in PROTOCOLS:
        p50, p99 = results[p]
        mark = "[green]" if p50 / raw50 <= TARGET else "[red]"
        table.add_row(
            f"Sluice, {p}",
            f"{p50:,.0f}",
            f"{p99:,.0f}",
            f"{mark}{p50 / raw50:.2f}[/]",
            f"{p99 / raw99:.2f}",
            f"p50 <= {TARGET:.0f}x",
        )
    console.print(table)
    console.print(
        "raw: XADD request → responder thread XREADGROUP BLOCK → XADD reply + XACK (pipelined) → client "
        "XREAD BLOCK. Sluice: TaskEvents.next_split() of subtask 0 against a JobManager in this process.",
        style="dim",
    )
    return results
