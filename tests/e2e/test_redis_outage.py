"""Redis away for a while under a running job, on real processes: the job finishes with
exact output and no restart spent (an outage of the log costs time, not the job)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sluice.client import Client, load_job
from sluice.events import JobStatus, LogRestarted
from sluice.services.embedded import RedisServer
from sluice.services.jobs.state import TERMINAL_JOB
from sluice.store import EventLog, Keys, connect
from tests.e2e.conftest import MARGIN, SLACK, SPARK_START, TEARDOWN, Processes, registered, start_tm, wait_until

JOBS = Path(__file__).parent / "jobs"


def write_text(path: Path, n: int = 3000) -> Path:
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta"]
    path.write_text("\n".join(" ".join(words[(i * 5 + k) % 7] for k in range(i % 5 + 1)) for i in range(n)) + "\n")
    return path


def expected_counts(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in path.read_text().splitlines():
        for w in line.lower().split():
            out[w] = out.get(w, 0) + 1
    return out


def ride_out(fsync: str, prefix: str, spark_remote: str, spark, tmp_path: Path, outage_s: float) -> None:
    """On a private Redis with that fsync policy, run the job on a JobManager and a
    TaskManager (two slots), kill -9 Redis while its sources run (one of them about to
    finish and report), bring Redis back on the same port and data after ``outage_s``,
    and check everything. Under ``appendfsync always`` nothing is lost and nothing runs
    again; under ``everysec`` the last second may be lost, so the leader renumbers and
    runs again every unfinished attempt (no restart counted) and the TaskManager drops its
    tasks and registers afresh."""
    redis = RedisServer(tmp_path / "redis", fsync=fsync)
    redis.start()
    try:
        _ride_out(redis, prefix, spark_remote, spark, tmp_path, outage_s)
    finally:
        redis.stop()


def _ride_out(redis: RedisServer, prefix: str, spark_remote: str, spark, tmp_path: Path, outage_s: float) -> None:
    durable = redis.fsync == "always"
    url = redis.url
    procs = Processes(url, prefix, tmp_path)
    markers = tmp_path / "markers"
    home = tmp_path / "home"
    try:
        procs.start(
            "jm",
            "jobmanager",
            "--storage-root",
            (tmp_path / "storage").as_uri(),
            "--slot-timeout",
            "120",
            env={"SLUICE_HOME": str(home), **SLACK},
        )
        # Splits are read slowly (about 1 s each), so split requests also meet the outage.
        start_tm(
            procs,
            {"home": home, "spark": spark_remote},
            "tm-1",
            slots=2,
            env={"SLUICE_TEST_MARKERS": str(markers), "SLUICE_IO_RATE": "2048"},
        )
        log = EventLog(connect(url), Keys(prefix))
        wait_until(lambda: registered(log) == {"tm-1"}, "the TaskManager", timeout=90)
        text = write_text(tmp_path / "in.txt")
        out = tmp_path / "out"
        job_id = Client(log).submit(load_job(JOBS / "outage.py", {"input": str(text), "output": str(out)}))
        wait_until(lambda: markers.exists() and any(markers.iterdir()), "a source task to finish reading", timeout=120)
        assert redis.proc is not None
        redis.proc.kill()  # kill -9: the AOF (appendfsync always) keeps every acknowledged write
        redis.proc.wait()
        gone = time.monotonic()
        time.sleep(outage_s)
        assert all(p.poll() is None for p in procs.procs.values()), "a process died while Redis was away"
        redis.start()
        away = time.monotonic() - gone
        log = EventLog(connect(url), Keys(prefix))
        client = Client(log)
        job = wait_until(lambda: (j := client.job(job_id)).status in TERMINAL_JOB and j, "the job to end", timeout=120)
        assert job.status == JobStatus.FINISHED, job.reason
        assert job.restarts == 0, f"the outage cost {job.restarts} restarts"
        got = {r["word"]: r["count"] for r in spark.read.parquet(str(out)).collect()}
        assert got == expected_counts(text)
        restarted = [
            env.event for _, env in log.replay(log.keys.facts(log.keys.cluster)) if isinstance(env.event, LogRestarted)
        ]
        if not durable:  # noticed by the run id, paid for by running unfinished attempts again
            assert len(restarted) == 1 and "may have lost its last writes" in restarted[0].reason
            print(f"Redis killed under everysec, back after {away:.1f} s: {restarted[0].reason}")
            return
        assert restarted == []
        tm = procs.output("tm-1")
        assert "worker died" not in tm, tm
        slots = "".join((home / "logs" / f"tm-1-slot{s}.log").read_text(errors="replace") for s in (0, 1))
        assert "is away" in slots and "is back after" in slots, slots  # one line each, not one per retry
        assert slots.count("is away") <= 4 and slots.count("could not connect") <= 2, slots
        print(f"Redis away {away:.1f} s; job FINISHED with {job.restarts} restarts")
    finally:
        procs.stop_all()


@pytest.mark.slow  # (41 s: the default run keeps the shorter outage tests; the chaos suite kills Redis too)
@pytest.mark.timeout(SPARK_START + 90 + 120 + 25 + 120 + MARGIN + TEARDOWN)
def test_a_job_rides_out_redis_killed_and_back_after_20_s(
    tmp_path: Path, prefix: str, spark_remote: str, spark
) -> None:
    ride_out("always", prefix, spark_remote, spark, tmp_path, outage_s=20)


@pytest.mark.slow  # (the chaos suite restarts Redis under both policies)
@pytest.mark.timeout(SPARK_START + 90 + 120 + 5 + 120 + MARGIN + TEARDOWN)
def test_a_job_survives_redis_killed_under_everysec(tmp_path: Path, prefix: str, spark_remote: str, spark) -> None:
    """kill -9 of a Redis that fsyncs every second: it may have lost acknowledged writes,
    and every process notices the restart by the server's run id (redis-py reconnects
    without a word). The job costs time, not data: exact output, no restart counted."""
    ride_out("everysec", prefix, spark_remote, spark, tmp_path, outage_s=2)


@pytest.mark.slow
@pytest.mark.timeout(SPARK_START + 90 + 120 + 65 + 120 + MARGIN + TEARDOWN)
def test_a_job_rides_out_redis_away_for_a_minute(tmp_path: Path, prefix: str, spark_remote: str, spark) -> None:
    ride_out("always", prefix, spark_remote, spark, tmp_path, outage_s=60)


def test_a_split_request_waits_through_redis_killed_and_back(tmp_path: Path, prefix: str) -> None:
    """The worker's side alone, in seconds: a source attempt that asked for a split and
    waits for the answer while Redis is killed (-9) and comes back, gets its answer (no
    error, no failed attempt), and the outage is said once each way."""
    import threading

    from sluice.events import Envelope, NextInputSplit, TaskDeploymentDescriptor, TaskSource
    from sluice.services.taskmanager.events import TaskEvents
    from sluice.store.connection import Outage

    redis = RedisServer(tmp_path / "redis", fsync="always")
    url = redis.start()
    try:
        client = connect(url, check=False)
        log = EventLog(client, Keys(prefix))
        d = TaskDeploymentDescriptor(
            "j1",
            "src:0:1",
            "src",
            0,
            1,
            1,
            128,
            "source",
            "",
            "m",
            [],
            {},
            [],
            source=TaskSource("text", {}, "input-splits"),
        )
        said: list[str] = []
        outage = Outage(client.ping, who="test worker", url=url, say=said.append)
        events = TaskEvents(log, d, "host-a", outage=outage, answer_timeout_s=20)
        got: list[object] = []
        asker = threading.Thread(target=lambda: got.append(events.next_split()))
        asker.start()
        job_inbox = log.keys.inbox(log.keys.job("j1"))
        wait_until(lambda: client.xlen(job_inbox) == 1, "the split request")
        assert redis.proc is not None
        redis.proc.kill()
        redis.proc.wait()
        time.sleep(3)
        assert asker.is_alive() and not got
        redis.start()
        log.append(
            log.keys.task_inbox(log.keys.job("j1"), "src", 0),
            Envelope(
                NextInputSplit("j1", "src:0:1", {"format": "text", "path": "/x", "index": 0}), "answer-1", 0, 0, "j1"
            ),
        )
        asker.join(timeout=20)
        assert got == [{"format": "text", "path": "/x", "index": 0}]
        assert outage.outages == 1 and outage.waited_s > 1.0
        assert [s.split(": ", 1)[1].split(" (")[0] for s in said] == [
            f"Redis at {url} is away",
            f"Redis at {url} is back after {outage.waited_s:.1f} s",
        ], said
    finally:
        redis.stop()


def test_waiting_for_redis_stops_when_the_owner_is_gone() -> None:
    from sluice.errors import RedisUnavailable
    from sluice.services.embedded import free_port
    from sluice.store.connection import Outage

    url = f"redis://127.0.0.1:{free_port()}/0"
    said: list[str] = []
    outage = Outage(
        connect(url, check=False).ping,
        who="w",
        url=url,
        say=said.append,
        give_up=lambda: "its TaskManager (pid 1) is gone",
    )
    with pytest.raises(RedisUnavailable, match="is gone"):
        outage.wait()
    assert len(said) == 2 and "gave up" in said[1]
