"""Prometheus metrics of real processes: a JobManager, a TaskManager that finishes tasks
without running them (no Spark) and the projector, each serving its endpoint on its own
port; scraped over HTTP during a job and after it, parsed with prometheus_client's parser,
and checked against the log. Then the embedded cluster: every process it starts serves
metrics on a free port, named in cluster.json and by `sluice status`."""

from __future__ import annotations

import hashlib
import json
import socket
import urllib.request
from pathlib import Path

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sluice.client import Client, JobFile
from sluice.events import JobStatus, TaskState, UpdateTaskExecutionState
from sluice.store import EventLog
from tests.e2e.conftest import MARGIN, TEARDOWN, Processes, registered, wait_until
from tests.e2e.test_cli import sluice
from tools.bench.control import graph

N = 2  # parallelism of both vertices: 2 x N subtasks
SLOTS = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """Every sample at ``url``: (name, sorted labels) -> value."""
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def get(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples: dict, name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


def scraper(procs: Processes, name: str, port: int):
    """The samples of one process's endpoint, or {} while it does not answer yet (a process
    that died makes the wait fail at once, with its output)."""

    def read() -> dict:
        if procs.procs[name].poll() is not None:
            raise AssertionError(f"{name} exited {procs.procs[name].returncode}:\n{procs.output(name)}")
        try:
            return scrape(f"http://127.0.0.1:{port}/metrics")
        except OSError:
            return {}

    return read


def job_facts(log: EventLog, job_id: str) -> list:
    return [env.event for _, env in log.replay(log.keys.facts(log.keys.job(job_id)))]


@pytest.mark.timeout(4 * 20 + 60 + MARGIN + TEARDOWN)
def test_each_process_serves_metrics_that_agree_with_the_log(procs: Processes, log: EventLog, tmp_path: Path) -> None:
    ports = {"jm": free_port(), "tm": free_port(), "projector": free_port()}
    home = {"SLUICE_HOME": str(tmp_path / "home")}
    procs.start("jm", "jobmanager", "--metrics-port", str(ports["jm"]), "--metrics-host", "127.0.0.1", env=home)
    procs.start(
        "projector",
        "projector",
        env={"SLUICE_PROJECTOR_METRICS_PORT": str(ports["projector"]), "SLUICE_METRICS_HOST": "127.0.0.1", **home},
    )
    jm, projector = scraper(procs, "jm", ports["jm"]), scraper(procs, "projector", ports["projector"])
    wait_until(lambda: get(jm(), "sluice_jobmanager_leading") == 1, "the JobManager leading")
    before = jm()
    assert get(before, "sluice_leadership_recovery_seconds_count") == 1
    assert get(before, "sluice_cluster_slots", state="free") == 0

    # A job submitted while no TaskManager is there waits for slots: seen while it waits.
    source = tmp_path / "in.txt"
    source.write_text("x\n")
    code = b"def identity(df):\n    return df\n"
    job = JobFile(
        Path("x.py"), code, hashlib.sha256(code).hexdigest(), "tools.bench.control", None, graph(N, str(source)), {}
    )
    client = Client(log)
    job_id = client.submit(job)
    waiting = wait_until(
        lambda: (s := jm()) and total(s, "sluice_tasks") == 2 * N and s,
        "the waiting job's tasks in the JobManager's metrics",
    )
    assert get(waiting, "sluice_tasks", state="CREATED") == 2 * N
    assert get(waiting, "sluice_jobs", status="CREATED") == 1
    # Handled twice: in the cluster's inbox (the job registered), then in the job's own.
    assert get(waiting, "sluice_events_handled_total", type="SubmitJob") == 2

    procs.start(
        "tm",
        "taskmanager",
        "--resource-id",
        "tm-1",
        "--slots",
        str(SLOTS),
        "--no-execute",
        "--metrics-port",
        str(ports["tm"]),
        "--metrics-host",
        "127.0.0.1",
        env=home,
    )
    tm = scraper(procs, "tm", ports["tm"])
    wait_until(lambda: registered(log) == {"tm-1"}, "the TaskManager's registration")
    ended = wait_until(
        lambda: (j := client.job(job_id, missing_ok=True)) is not None and j.status == JobStatus.FINISHED and j,
        "the job to finish",
    )
    assert ended.status == JobStatus.FINISHED

    facts = job_facts(log, job_id)
    states = [f.state for f in facts if isinstance(f, UpdateTaskExecutionState)]
    assert states.count(TaskState.FINISHED) == 2 * N
    after = wait_until(
        lambda: (s := jm()) and get(s, "sluice_cluster_slots", state="free") == SLOTS and s,
        "every slot free again in the JobManager's metrics",
    )
    assert get(after, "sluice_cluster_slots", state="in_use") == 0
    assert get(after, "sluice_cluster_taskmanagers") == 1
    for state in set(states):
        assert get(after, "sluice_task_transitions_total", state=state.value) == states.count(state), state
    assert get(after, "sluice_events_appended_total", type="UpdateTaskExecutionState", stream="facts") == len(states)
    assert get(after, "sluice_events_appended_total", type="SubmitTask", stream="outbox") == 2 * N
    assert get(after, "sluice_task_restarts_total") == 0
    assert get(after, "sluice_inbox_lag_entries", inbox="cluster") == 0
    assert get(after, "sluice_dead_letter_entries", scope="cluster") == 0
    assert total(after, "sluice_events_handled_total") > total(before, "sluice_events_handled_total")

    t = wait_until(
        lambda: (s := tm()) and get(s, "sluice_taskmanager_slots", state="free") == SLOTS and s,
        "the TaskManager's slots free",
    )
    assert get(t, "sluice_taskmanager_tasks_ended_total", state="FINISHED") == 2 * N
    assert get(t, "sluice_taskmanager_registered") == 1
    assert get(t, "sluice_events_handled_total", type="SubmitTask") == 2 * N
    assert get(t, "sluice_inbox_lag_entries", inbox="taskmanager") == 0

    # The projector has folded every fact of the job (each read once).
    wait_until(
        lambda: get(projector(), "sluice_events_handled_total", type="UpdateTaskExecutionState") == len(states),
        "the projector's count of the job's task states",
    )
    p = projector()
    assert get(p, "sluice_projector_tables", projection="executiongraph") == 1
    assert get(p, "sluice_projector_table_writes_total") > 0


def test_a_taken_metrics_port_stops_the_process_with_what_to_do(tmp_path: Path, redis_url: str, prefix: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = sluice(
            tmp_path,
            "--redis",
            redis_url,
            "--prefix",
            prefix,
            "projector",
            "--metrics-port",
            str(port),
            "--metrics-host",
            "127.0.0.1",
            check=False,
            timeout=60,
        )
    assert proc.returncode == 1
    assert (
        f"metrics port {port} on 127.0.0.1 is already in use by another process: give --metrics-port (or "
        "$SLUICE_PROJECTOR_METRICS_PORT) a free port, or 0 to serve no metrics" in proc.stderr
    )
    bad = sluice(
        tmp_path,
        "--redis",
        redis_url,
        "--prefix",
        prefix,
        "taskmanager",
        "--metrics-port",
        "70000",
        check=False,
        timeout=60,
    )
    assert bad.returncode == 1
    assert "--metrics-port='70000' is not allowed: give a port number from 0 to 65535" in bad.stderr


@pytest.mark.timeout(3 * 90 + MARGIN)  # three commands
def test_the_embedded_cluster_records_its_endpoints_and_status_shows_them(tmp_path: Path) -> None:
    sluice(tmp_path, "cluster", "start", "--taskmanagers", "1", "--slots", "2")
    try:
        recorded = json.loads((tmp_path / ".sluice" / "cluster.json").read_text())["metrics"]
        st = orjson.loads(sluice(tmp_path, "status", "--json").stdout)
        by_role = {p["role"]: p["metrics"] for p in st["processes"]}
        assert set(by_role) == {"jobmanager", "taskmanager", "projector"}
        assert sorted(by_role.values()) == sorted(recorded.values())
        assert len(set(recorded.values())) == 3
        text = sluice(tmp_path, "status").stdout
        for role, url in by_role.items():
            assert url.startswith("http://127.0.0.1:")
            assert any(line.strip().startswith(role) and line.endswith(url) for line in text.splitlines()), text
        tm = wait_until(
            lambda: (s := _try(by_role["taskmanager"])) and get(s, "sluice_taskmanager_registered") == 1 and s,
            "the TaskManager's endpoint",
        )
        assert get(tm, "sluice_taskmanager_slots", state="free") == 2
        jm = wait_until(
            lambda: (s := _try(by_role["jobmanager"])) and get(s, "sluice_jobmanager_leading") == 1 and s,
            "the JobManager's endpoint",
        )
        assert get(jm, "sluice_cluster_slots", state="free") == 2
    finally:
        sluice(tmp_path, "cluster", "stop", check=False)
    assert "metrics" not in json.loads((tmp_path / ".sluice" / "cluster.json").read_text())  # stopped: none


def _try(url: str) -> dict:
    try:
        return scrape(url)
    except OSError:
        return {}
