"""Running real Sluice processes against the test Redis, and waiting on what the log says."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from sluice.events import Envelope
from sluice.services.membership.core import Membership, evolve
from sluice.store import EventLog

T = TypeVar("T")

FAST = {
    "SLUICE_HEARTBEAT_INTERVAL_MS": "100",
    "SLUICE_HEARTBEAT_TIMEOUT_MS": "800",
    "SLUICE_LEASE_TTL_MS": "800",
}

# What a test's own waits add up to, for its ``@pytest.mark.timeout``: the timeout must be
# larger than the sum of the waits, so that a slow run fails with the message of the wait
# that ran out, not with pytest-timeout's stack dump.
SPARK_START = 120
"""The first test that needs Spark starts the session's Spark Connect server (its wait)."""
TEARDOWN = 90
"""Stopping a test's processes (``Processes.stop_all``: up to 10 s each), its Redis, and,
after the session's last test, the Spark Connect server (up to 20 s)."""
MARGIN = 30
"""What a test does outside its waits: plain PySpark to compare with, reading the log."""


def wait_until(check: Callable[[], T], what: str, timeout: float = 20.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def facts(log: EventLog) -> list[Envelope]:
    return [e for _, e in log.replay(log.keys.facts(log.keys.cluster))]


def membership(log: EventLog) -> Membership:
    state = Membership()
    for e in facts(log):
        evolve(state, e)
    return state


def registered(log: EventLog) -> set[str]:
    return {r.resource_id for r in membership(log).active()}


def grant_entry(log: EventLog, epoch: int) -> str | None:
    """The entry id of the LeadershipGranted of ``epoch`` in the cluster's facts (None: not yet)."""
    return next(
        (
            i
            for i, e in log.replay(log.keys.facts(log.keys.cluster))
            if e.type == "LeadershipGranted" and e.event.epoch == epoch
        ),
        None,
    )


def _order(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def assert_facts_after_takeover(log: EventLog, tag: str, killed_epoch: int) -> list[Envelope]:
    """A takeover mattered: facts of ``tag`` were committed after the new leader's
    LeadershipGranted, every one of them at the new leader's epoch (above the killed
    leader's), and none before the grant carries it. Returns the facts after the grant."""
    grants = [e.event for e in facts(log) if e.type == "LeadershipGranted"]
    epoch = grants[-1].epoch
    assert epoch > killed_epoch, f"no takeover after epoch {killed_epoch}: {grants}"
    cut = _order(grant_entry(log, epoch) or "0-0")
    entries = list(log.replay(log.keys.facts(tag)))
    before = [e for i, e in entries if _order(i) < cut]
    after = [e for i, e in entries if _order(i) > cut]
    assert after, f"nothing was committed to {tag} after the takeover at epoch {epoch}"
    assert {e.epoch for e in after} == {epoch}, [(e.type, e.epoch) for e in after if e.epoch != epoch]
    assert all(e.epoch < epoch for e in before)
    return after


def entry_ms(entry_id: str) -> int:
    """The server time (ms) at which a stream entry was written."""
    return int(entry_id.split("-")[0])


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _cluster_processes(prefix: str) -> dict[int, list[str]]:
    """Live Sluice processes (``python -m sluice --prefix PREFIX ...``) by pid, with their argv."""
    found = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv if a]
        if "--prefix" not in args or args[args.index("--prefix") + 1] != prefix or "sluice" not in args:
            continue
        if "sluice.services.common.guard" in args:
            args = args[args.index("sluice.services.common.guard") + 3 :]  # about to exec into the rest
        if alive(int(d.name)):
            found[int(d.name)] = args
    return found


def cluster_pids(prefix: str) -> list[int]:
    """Live processes of the cluster under ``prefix`` (other tests' clusters use other prefixes)."""
    return sorted(_cluster_processes(prefix))


def worker_pids(prefix: str, resource_id: str, slot: int | None = None) -> list[int]:
    """Live RQ worker processes (``sluice worker``) of one TaskManager of this test's
    cluster (matched on its key prefix too: other tests reuse resource ids)."""
    found = []
    for pid, args in _cluster_processes(prefix).items():
        if "worker" not in args:
            continue
        tail = args[args.index("worker") :]
        if tail[:3] == ["worker", "--resource-id", resource_id] and (
            slot is None or tail[3:5] == ["--slot", str(slot)]
        ):
            found.append(pid)
    return sorted(found)


class Processes:
    """Sluice processes of one test, each logging to its own file, all killed at teardown."""

    def __init__(self, url: str, prefix: str, logs: Path) -> None:
        self.url, self.prefix, self.logs = url, prefix, logs
        self.procs: dict[str, subprocess.Popen] = {}

    def start(
        self, name: str, role: str, *args: str, url: str | None = None, env: dict | None = None
    ) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "sluice", "--redis", url or self.url, "--prefix", self.prefix, role, *args]
        from sluice.services.common.guard import guarded

        with open(self.logs / f"{name}.log", "wb") as out:  # the child keeps its own copy
            # A home of the test's own (unless the test names one): never the checkout's .sluice/.
            home = {"SLUICE_HOME": str(self.logs / "home")}
            proc = subprocess.Popen(
                guarded(cmd), stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **FAST, **home, **(env or {})}
            )
        self.procs[name] = proc
        return proc

    def output(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def signal(self, name: str, sig: int) -> None:
        self.procs[name].send_signal(sig)

    def stop_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGCONT)
                    p.kill()
                except ProcessLookupError:
                    pass
            p.wait(timeout=10)


# Spark shares the 2 cores with everything else here: in tests that run jobs, heartbeats
# get more slack than in the membership tests, so a busy machine does not turn into lost
# TaskManagers.
SLACK = {"SLUICE_HEARTBEAT_INTERVAL_MS": "200", "SLUICE_HEARTBEAT_TIMEOUT_MS": "10000", "SLUICE_LEASE_TTL_MS": "5000"}


@pytest.fixture
def cluster(procs: Processes, log: EventLog, spark_remote: str, tmp_path: Path) -> Iterator[dict]:
    """A JobManager for running jobs (storage under tmp_path), and where TaskManagers go."""
    home = tmp_path / "home"
    procs.start(
        "jm",
        "jobmanager",
        "--storage-root",
        (tmp_path / "storage").as_uri(),
        "--slot-timeout",
        "120",
        env={"SLUICE_HOME": str(home), **SLACK},
    )
    yield {"home": home, "spark": spark_remote}
    # Whatever the test ran, the projector's tables are the fold of the log it left
    # (`sluice replay --check`, at each table's own position).
    from sluice.services.projector import Projector
    from sluice.views.replay import check

    Projector(log).catch_up()
    Projector(log).catch_up()  # a job's tables are followed once the cluster's names the job
    result = check(log)
    assert result.agree, [vars(d) for d in result.differences[:10]]


def start_tm(procs: Processes, cluster: dict, name: str, slots: int = 2, env: dict | None = None) -> None:
    procs.start(
        name,
        "taskmanager",
        "--resource-id",
        name,
        "--slots",
        str(slots),
        "--spark",
        cluster["spark"],
        env={"SLUICE_HOME": str(cluster["home"]), **SLACK, **(env or {})},
    )


@pytest.fixture
def procs(redis_url: str, prefix: str, tmp_path: Path) -> Iterator[Processes]:
    p = Processes(redis_url, prefix, tmp_path)
    yield p
    p.stop_all()
    for name in p.procs:  # shown by pytest only when the test failed
        print(f"----- {name} (last lines) -----")
        print("\n".join(p.output(name).splitlines()[-25:]))
