"""A slot's worker on a network that changes under it (what ``scripts/compose-check`` found:
a TaskManager container connected again at a new address). Redis serves a BLMOVE still
pending on the worker's old connection, the reply goes nowhere, and the task sits in the
queue's intermediate list: the worker puts it back and runs it. A connection cut silently
(no FIN, no RST) is noticed by TCP keepalive, not waited on for good."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from rq import Queue
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from sluice.store import EventLog, Keys, connect
from sluice.store import connection as connection_module
from sluice.store import slots as slots_module
from sluice.store.slots import put_back_lost, slot_worker_class
from tests.conftest import RQ_PREFIX

NOOP = "tools.bench.tasks.noop"


@pytest.fixture
def log(rq_log: EventLog) -> EventLog:
    return rq_log  # (tests/store/conftest.py)


def _queue(client: Any, keys: Keys) -> Queue:
    return Queue(keys.slot_queue("tm-1", 0), connection=client, serializer=JSONSerializer)


def _blocked(admin: Any, at_least: int) -> None:
    deadline = time.monotonic() + 10
    while admin.info("clients")["blocked_clients"] < at_least:
        assert time.monotonic() < deadline, "no client blocked on the queue"
        time.sleep(0.01)


def _ghost_takes_the_next_job(client: Any, queue: Queue) -> Any:
    """A connection blocked in BLMOVE on the queue whose reply nobody reads: the old
    connection of a worker whose address changed, still open on the server."""
    ghost = client.connection_pool.make_connection()
    ghost.connect()
    ghost.send_command("BLMOVE", queue.key, queue.intermediate_queue_key, "LEFT", "RIGHT", 0)
    _blocked(client, 1)
    return ghost


def test_a_task_a_lost_dequeue_left_in_the_intermediate_list_is_put_back_and_run(log: EventLog) -> None:
    client = log.backend.client  # type: ignore[attr-defined]
    queue = _queue(client, log.keys)
    ghost = _ghost_takes_the_next_job(client, queue)
    try:
        job = queue.enqueue(NOOP, job_id="lost-1")
        assert client.lrange(queue.intermediate_queue_key, 0, -1) == [b"lost-1"]  # the ghost took it
        assert queue.count == 0
        worker = slot_worker_class()([queue], name="slot-lost", connection=client, serializer=JSONSerializer)
        worker.work(burst=True, with_scheduler=False, logging_level="WARNING")
        assert job.get_status(refresh=True) == JobStatus.FINISHED
        assert worker.put_back == ("lost-1",)
        assert client.llen(queue.intermediate_queue_key) == 0
    finally:
        ghost.disconnect()


def test_put_back_lost_drops_a_cancelled_task_and_leaves_a_started_one(log: EventLog) -> None:
    client = log.backend.client  # type: ignore[attr-defined]
    queue = _queue(client, log.keys)
    for job_id in ("queued", "cancelled", "started"):
        queue.enqueue(NOOP, job_id=job_id)
    Job.fetch("cancelled", connection=client, serializer=JSONSerializer).cancel()
    for _ in range(2):  # what BLMOVE does: queue -> intermediate list
        client.lmove(queue.key, queue.intermediate_queue_key)
    client.rpush(queue.intermediate_queue_key, "cancelled", "gone")
    client.zadd(queue.started_job_registry.key, {"started:an-execution": time.time() + 60})  # as RQ starts it
    assert client.lrange(queue.intermediate_queue_key, 0, -1) == [b"queued", b"started", b"cancelled", b"gone"]

    assert put_back_lost(queue) == ["queued"]
    assert client.lrange(queue.key, 0, -1) == [b"queued"]  # at the head, once
    assert client.lrange(queue.intermediate_queue_key, 0, -1) == [b"started"]  # RQ's to settle
    assert put_back_lost(queue) == []  # nothing twice


def test_every_redis_connection_has_keepalive_and_a_timeout_above_the_slot_workers_wait(redis_url: str) -> None:
    client = connect(redis_url)
    conn = client.connection_pool.get_connection()
    try:
        sock = conn._sock
        assert sock is not None
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        if hasattr(socket, "TCP_KEEPIDLE"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == connection_module.KEEPALIVE_IDLE_S
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == connection_module.KEEPALIVE_PROBES
        assert conn.socket_timeout == connection_module.SOCKET_TIMEOUT_S > slots_module.DEQUEUE_TIMEOUT_S
        # RQ gives a worker's connections a timeout 10 s above its wait only if it is lower: ours stays
        worker = slot_worker_class()([_queue(client, Keys(RQ_PREFIX))], name="slot-timeout", connection=client)
        assert worker.dequeue_timeout == slots_module.DEQUEUE_TIMEOUT_S
        assert client.connection_pool.connection_kwargs["socket_timeout"] >= worker.connection_timeout
    finally:
        client.connection_pool.release(conn)
        client.close()


# --- a connection cut silently, on a real redis-server of its own ----------------------------


def _iptables(*args: str) -> None:
    subprocess.run(["iptables", "-w", *args], check=True, capture_output=True)


def _can_drop_packets() -> str | None:
    if shutil.which("iptables") is None:
        return "iptables is not installed"
    if os.geteuid() != 0:
        return "dropping packets on loopback needs root"
    try:
        _iptables("-S", "INPUT")
    except (subprocess.CalledProcessError, OSError) as exc:
        return f"iptables does not answer here: {exc}"
    return None


class _Cut:
    """Drop every packet to and from a TCP port on loopback: the connection stays open at
    both ends and nothing tells either side (as a peer whose address changed)."""

    def __init__(self, port: int) -> None:
        self.rules = [
            ("INPUT", "-i", "lo", "-p", "tcp", "--dport", str(port), "-j", "DROP"),
            ("INPUT", "-i", "lo", "-p", "tcp", "--sport", str(port), "-j", "DROP"),
        ]
        self.on = False

    def __enter__(self) -> _Cut:
        for chain, *rule in self.rules:
            _iptables("-I", chain, *rule)
        self.on = True
        return self

    def mend(self) -> None:
        if self.on:
            for chain, *rule in self.rules:
                _iptables("-D", chain, *rule)
            self.on = False

    def __exit__(self, *exc: object) -> None:
        self.mend()


@pytest.fixture
def own_redis() -> Iterator[tuple[str, Any]]:
    """A redis-server of this test's own on a TCP port (the one cut), and a client of it
    through its unix socket (never cut)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    folder = Path(tempfile.mkdtemp(prefix="sluice-cut-"))
    unix = folder / "redis.sock"
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--unixsocket", str(unix), "--save", "",
         "--appendonly", "no", "--dir", str(folder)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    admin = redis.Redis(unix_socket_path=str(unix))
    deadline = time.monotonic() + 10
    while True:
        try:
            admin.ping()
            break
        except (redis.ConnectionError, FileNotFoundError):
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
    try:
        yield f"redis://127.0.0.1:{port}/0", admin
    finally:
        admin.close()
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow  # about 6 s: the keepalive's probes, RQ's pause before it connects again
def test_a_worker_whose_connection_is_cut_silently_mid_dequeue_recovers_and_runs_the_task(
    own_redis: tuple[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker waits in BLMOVE; its packets are dropped both ways; the task is queued
    meanwhile and Redis serves that BLMOVE (the reply is dropped). The worker's keepalive
    breaks the connection, it connects again once packets flow, finds the task in the
    intermediate list, puts it back and runs it. Before: it waited on the dead socket (RQ's
    405 s BLMOVE, no keepalive) and the task stayed in the list for good."""
    problem = _can_drop_packets()
    if problem:
        pytest.skip(problem)
    url, admin = own_redis
    monkeypatch.setattr(connection_module, "KEEPALIVE_IDLE_S", 1)
    monkeypatch.setattr(connection_module, "KEEPALIVE_INTERVAL_S", 1)
    monkeypatch.setattr(connection_module, "KEEPALIVE_PROBES", 2)
    keys = Keys(RQ_PREFIX)
    client = connect(url)
    queue = _queue(client, keys)
    broke = threading.Event()

    class Broke(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "could not connect to Redis" in record.getMessage():
                broke.set()

    worker = slot_worker_class()([queue], name="slot-cut", connection=client, serializer=JSONSerializer)
    handler = Broke()
    worker.log.addHandler(handler)
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    failures: list[BaseException] = []

    def cut_while_it_waits() -> None:
        try:
            _blocked(admin, 1)  # the worker waits in BLMOVE (DEQUEUE_TIMEOUT_S: long enough)
            with _Cut(port) as cut:
                admin_queue = _queue(admin, keys)
                admin_queue.enqueue(NOOP, job_id="cut-1")
                assert admin.lrange(queue.intermediate_queue_key, 0, -1) == [b"cut-1"]  # served; reply dropped
                assert broke.wait(30), "the worker did not notice its dead connection"
                cut.mend()
        except BaseException as exc:
            failures.append(exc)

    t = threading.Thread(target=cut_while_it_waits, daemon=True)
    t.start()
    try:
        worked = worker.work(max_jobs=1, max_idle_time=40, with_scheduler=False, logging_level="WARNING")
    finally:
        t.join(40)
        worker.log.removeHandler(handler)
        client.close()
    assert not failures, failures
    assert worked, "the task never ran"
    assert worker.put_back == ("cut-1",)
    assert Job.fetch("cut-1", connection=admin, serializer=JSONSerializer).get_status() == JobStatus.FINISHED
