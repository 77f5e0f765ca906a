"""The command line as a user meets it: the embedded cluster, status on a stopped cluster,
scaling at run time, inspection, and clear errors."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest

from sluice.events import TaskManagerHeartbeat
from sluice.store import EventLog
from tests.e2e.conftest import FAST, MARGIN
from tests.helpers import env as envelope

ROOT = Path(__file__).resolve().parents[2]


DEFAULT_TIMES = {
    "SLUICE_HEARTBEAT_INTERVAL_MS": "1000",
    "SLUICE_HEARTBEAT_TIMEOUT_MS": "5000",
    "SLUICE_LEASE_TTL_MS": "3000",
}
"""The product's own heartbeat and lease times, for a test that detects no failure: FAST's
800 ms can get a process starved for a moment on a loaded machine declared lost."""


def sluice(
    cwd: Path, *args: str, check: bool = True, timeout: float = 90, times: dict[str, str] = FAST
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")} | times
    proc = subprocess.run(
        [sys.executable, "-m", "sluice", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"sluice {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def status(cwd: Path) -> dict:
    return orjson.loads(sluice(cwd, "status", "--json").stdout)


@pytest.mark.timeout(5 * 90 + MARGIN)  # five commands, 90 s each
def test_cluster_up_then_status_and_inspect_on_the_stopped_cluster(tmp_path: Path) -> None:
    up = sluice(tmp_path, "cluster", "up", "--taskmanagers", "2", "--slots", "3")
    assert up.stdout.count("REGISTERED") >= 2 and "6 slots" in up.stdout
    assert "stopped cleanly" in up.stdout
    assert (tmp_path / ".sluice" / "redis").is_dir()
    # Later commands bring the embedded Redis back on the same data.
    st = status(tmp_path)
    assert st["leader"]["epoch"] == 1
    assert [r["status"] for r in st["taskmanagers"]] == ["UNREGISTERED", "UNREGISTERED"]
    assert {r["slots"] for r in st["taskmanagers"]} == {3}
    lines = [orjson.loads(x) for x in sluice(tmp_path, "inspect", "tail", "--json").stdout.splitlines()]
    types = [x.get("type") for x in lines]
    for t in (
        "LeadershipGranted",
        "RegisterTaskManager",
        "TaskManagerRegistered",
        "AcknowledgeRegistration",
        "TaskManagerHeartbeat",
        "UnregisterTaskManager",
        "TaskManagerUnregistered",
    ):
        assert t in types, t
    ids = [tuple(map(int, x["entry"].split("-"))) for x in lines]
    assert ids == sorted(ids)  # in order across streams
    acks = [x for x in lines if x.get("type") == "AcknowledgeRegistration" and x["stream"] == "cluster:outbox"]
    assert acks and all(a["to"].startswith("tm:") for a in acks)
    facts_only = sluice(tmp_path, "inspect", "tail", "cluster:facts").stdout
    assert "TaskManagerRegistered" in facts_only and "RegisterTaskManager " not in facts_only
    script = subprocess.run(
        [str(ROOT / "scripts" / "inspect"), "tail", "facts", "-n", "1", "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
    )
    assert script.returncode == 0, script.stderr
    assert orjson.loads(script.stdout)["type"] == "TaskManagerUnregistered"


def _spark_remote_of(pid: int) -> str | None:
    """The Spark Connect server a running process was told to use ($SLUICE_SPARK_REMOTE)."""
    for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        if item.startswith(b"SLUICE_SPARK_REMOTE="):
            return item.split(b"=", 1)[1].decode()
    return None


def _cluster_json(tmp_path: Path) -> dict:
    return orjson.loads((tmp_path / ".sluice" / "cluster.json").read_bytes())


@pytest.mark.timeout(7 * 90 + MARGIN)  # seven commands, 90 s each
def test_scale_adds_and_removes_taskmanagers_at_run_time(tmp_path: Path) -> None:
    # (it once failed in a full run, on a loaded machine, with FAST's 800 ms times; its
    # assertions now print what they saw)
    sluice(tmp_path, "cluster", "start", "--taskmanagers", "1", times=DEFAULT_TIMES)
    spark = _cluster_json(tmp_path)["spark"]  # one Spark Connect server for the cluster, started with it
    try:
        rows = status(tmp_path)["taskmanagers"]
        assert sum(r["status"] == "REGISTERED" for r in rows) == 1, rows
        out = sluice(tmp_path, "scale", "--taskmanagers", "3", times=DEFAULT_TIMES).stdout
        assert "3 TaskManagers registered" in out, out
        tms = [p for p in _cluster_json(tmp_path)["processes"] if p["role"] == "taskmanager"]
        assert [_spark_remote_of(p["pid"]) for p in tms] == [spark["url"]] * 3, tms  # the ones scale added too
        assert "SparkConnectServer" in Path(f"/proc/{spark['pid']}/cmdline").read_text()
        out = sluice(tmp_path, "scale", "--taskmanagers", "1", times=DEFAULT_TIMES).stdout
        assert "1 TaskManagers registered" in out, out
        rows = status(tmp_path)["taskmanagers"]
        assert sorted(r["status"] for r in rows) == ["REGISTERED", "UNREGISTERED", "UNREGISTERED"], rows
        assert all(r["reason"] == "stopped gracefully" for r in rows if r["status"] == "UNREGISTERED"), rows
    finally:
        sluice(tmp_path, "cluster", "stop", check=False)
    assert "no embedded cluster runs" in sluice(tmp_path, "scale", "-n", "2", check=False).stderr
    assert not alive_pid(spark["pid"]), "the cluster's Spark server outlived `sluice cluster stop`"


def alive_pid(pid: int) -> bool:
    from sluice.services.embedded.supervisor import alive

    return alive(pid)


@pytest.mark.timeout(2 * 90 + MARGIN)  # two commands
def test_a_spark_server_per_taskmanager_is_left_to_each_taskmanager(tmp_path: Path) -> None:
    sluice(tmp_path, "cluster", "start", "--taskmanagers", "1", "--spark-servers", "per-taskmanager")
    try:
        data = _cluster_json(tmp_path)
        assert "spark" not in data
        (tm,) = [p for p in data["processes"] if p["role"] == "taskmanager"]
        assert _spark_remote_of(tm["pid"]) is None  # it starts its own when a task needs Spark
    finally:
        sluice(tmp_path, "cluster", "stop", check=False)
    bad = sluice(tmp_path, "cluster", "start", "--spark-servers", "two", check=False)
    assert (
        bad.returncode != 0 and "--spark-servers='two' is not allowed: give shared or per-taskmanager" in bad.stderr
    ), bad.stderr


class LineReader:
    """Lines of a child's stdout, read on a thread: waiting for one has a deadline, so a
    follower that prints nothing fails the test with a message instead of hanging it."""

    def __init__(self, stream) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self.thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self.thread.start()

    def _pump(self, stream) -> None:
        for line in stream:
            self.lines.put(line)

    def next_matching(self, check, what: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        seen = []
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            rec = orjson.loads(line)
            if check(rec):
                return rec
            seen.append(rec.get("type"))
        raise AssertionError(f"timed out after {timeout} s waiting for {what}; the follower printed {seen}")


@pytest.mark.timeout(20 + 20 + 10 + 10 + MARGIN)  # three lines, the follower's exit
def test_tail_follow_prints_events_appended_after_it_started(
    tmp_path: Path, redis_url: str, prefix: str, log: EventLog
) -> None:
    inbox = log.keys.inbox(log.keys.cluster)
    log.append(inbox, envelope(TaskManagerHeartbeat("tm-before", "s", 1, 0)))
    env = {**os.environ, "SLUICE_REDIS_URL": redis_url, "SLUICE_PREFIX": prefix}
    follower = subprocess.Popen(
        [sys.executable, "-m", "sluice", "inspect", "tail", "--follow", "--json"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        reader = LineReader(follower.stdout)
        # What was there is printed first: once it is, the follower has read the streams
        # and anything appended now can only reach it by following.
        reader.next_matching(lambda r: r["payload"].get("resource_id") == "tm-before", "the existing event", 20)
        log.append(inbox, envelope(TaskManagerHeartbeat("tm-after", "s", 1, 0)))
        rec = reader.next_matching(lambda r: r.get("type") == "TaskManagerHeartbeat", "the event appended after", 20)
        assert rec["payload"]["resource_id"] == "tm-after" and rec["stream"] == "cluster:inbox"
        # A stream that did not exist when it started is followed too.
        log.append(log.keys.inbox(log.keys.taskmanager("tm-new")), envelope(TaskManagerHeartbeat("tm-new", "s", 1, 0)))
        rec = reader.next_matching(lambda r: True, "an event on a new stream", 10)
        assert rec["payload"]["resource_id"] == "tm-new" and rec["stream"] == "tm:tm-new:inbox"
        assert follower.poll() is None
    finally:
        follower.kill()
        follower.wait(timeout=10)
        follower.stdout.close()


@pytest.mark.timeout(90 + MARGIN)  # the command
@pytest.mark.parametrize(
    "args, says",
    [
        (["--redis", "redis://127.0.0.1:1/0", "status"], "cannot reach Redis at redis://127.0.0.1:1/0"),
        (
            ["--redis", "http://example/", "status"],
            "is not a Redis URL: give a redis://, rediss:// (TLS) or unix:// URL",
        ),
        (["--redis", "redis://user:hunter2@127.0.0.1:1/0", "status"], "redis://user:***@127.0.0.1:1/0"),
        (["--prefix", "bad prefix!", "status"], "--prefix='bad prefix!' is not a usable key prefix"),
        (["--redis", "http://user:hunter2@127.0.0.1:1/0", "status"], "--redis='http://user:***@127.0.0.1:1/0'"),
    ],
)
def test_bad_settings_get_clear_errors(tmp_path: Path, args: list[str], says: str) -> None:
    proc = sluice(tmp_path, *args, check=False)
    assert proc.returncode == 1
    assert says in proc.stderr
    assert "hunter2" not in proc.stderr + proc.stdout


@pytest.mark.timeout(90 + MARGIN)  # the command
def test_a_deployment_timeout_shorter_than_slot_reports_can_answer_is_refused(
    tmp_path: Path, redis_url: str, prefix: str
) -> None:
    proc = sluice(
        tmp_path,
        "--redis",
        redis_url,
        "--prefix",
        prefix,
        "jobmanager",
        "--deploy-timeout",
        "1",
        check=False,
        timeout=30,
    )  # with the tests' heartbeat timeout of 800 ms
    assert proc.returncode == 1
    assert "--deploy-timeout=1 s is shorter than twice the heartbeat timeout (800 ms)" in proc.stderr
    assert "at least 2 s" in proc.stderr


@pytest.mark.timeout(90 + MARGIN)  # the command
def test_an_unknown_stream_is_named_with_the_ones_that_exist(tmp_path: Path, redis_url: str, prefix: str) -> None:
    proc = sluice(tmp_path, "--redis", redis_url, "--prefix", prefix, "inspect", "tail", "nosuch", check=False)
    assert proc.returncode == 1 and "no stream 'nosuch'" in proc.stderr
