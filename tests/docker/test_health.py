"""``sluice health``, the image's HEALTHCHECK (sluice/cli/health.py): which process and port
it asks, what it calls well, and a real metrics endpoint and a closed port asked."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from sluice.cli.health import Probe, check, health, probe_for, verdict
from sluice.services.common.metrics import ProjectorMetrics, TaskManagerMetrics, serve


def test_the_role_and_port_come_from_the_command_line_then_the_environment() -> None:
    argv = ["/usr/local/bin/python", "/usr/local/bin/sluice", "taskmanager", "--slots", "2", "--metrics-port", "9251"]
    assert probe_for(argv, {}) == Probe("taskmanager", "http://127.0.0.1:9251/metrics")
    env = {"SLUICE_JOBMANAGER_METRICS_PORT": "9350", "SLUICE_METRICS_HOST": "10.1.2.3"}
    assert probe_for(["sluice", "jobmanager"], env) == Probe("jobmanager", "http://10.1.2.3:9350/metrics")
    assert probe_for(["sluice", "projector", "--metrics-port=9999"], env).url == "http://10.1.2.3:9999/metrics"
    # sluice's own options before the role, whose values could look like one
    argv = ["sluice", "--prefix", "ui", "--redis", "redis://r:6379/0", "ui", "--host", "0.0.0.0", "--port", "8088"]
    assert probe_for(argv, {}) == Probe("ui", "http://127.0.0.1:8088/api/taskmanagers")
    assert probe_for(["sluice", "ui", "--host", "::1"], {}).url == "http://[::1]:8087/api/taskmanagers"


def test_a_process_that_serves_no_port_or_runs_another_command_is_said_so() -> None:
    probe = probe_for(["sluice", "projector"], {})
    assert probe.problem == (
        "no port to ask the projector on: it serves none; start it with --metrics-port "
        "(or $SLUICE_PROJECTOR_METRICS_PORT) PORT"
    )
    assert check(probe) == (False, probe.problem)
    assert "'x9' is not a port" in probe_for(["sluice", "taskmanager", "--metrics-port", "x9"], {}).problem
    assert check(probe_for(["spark-class", "org.apache.spark.deploy.master.Master"], {})) == (
        True,
        "not a Sluice service: nothing to check",
    )


def test_what_each_role_calls_well() -> None:
    assert verdict("taskmanager", "# HELP x\nsluice_taskmanager_registered 1.0\n") == (
        True,
        "taskmanager: registered with the leader",
    )
    ok, line = verdict("taskmanager", "sluice_taskmanager_registered 0.0\n")
    assert not ok and "not registered with a leader" in line
    assert not verdict("taskmanager", "sluice_events_handled_total 3.0\n")[0]
    assert verdict("jobmanager", "sluice_jobmanager_leading 0.0\n") == (True, "jobmanager: standing by for the lease")
    assert verdict("jobmanager", "sluice_jobmanager_leading 1.0\n") == (True, "jobmanager: leading")
    assert not verdict("jobmanager", "")[0]
    assert verdict("projector", "") == (True, "projector: answering")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port  # closed once the block ends


@pytest.fixture
def registered() -> Iterator[tuple[str, list[int]]]:
    """A TaskManager's metrics served on a free port: (port, [registered]) to flip."""
    from prometheus_client.core import GaugeMetricFamily

    metrics, flag = TaskManagerMetrics(), [0]
    metrics.collect_with(lambda: [GaugeMetricFamily("sluice_taskmanager_registered", "", value=flag[0])])
    port = free_port()
    served = serve(metrics, port, "127.0.0.1")
    yield str(port), flag
    served.stop()


def test_a_real_metrics_endpoint_asked_before_and_after_registration(registered: tuple[str, list[int]]) -> None:
    port, flag = registered
    probe = probe_for(["sluice", "taskmanager", "--metrics-port", port], {})
    assert check(probe) == (False, "taskmanager: not registered with a leader (none leads, or Redis is out of reach)")
    flag[0] = 1
    assert check(probe) == (True, "taskmanager: registered with the leader")
    # the command, with the role and port given (this process is not a TaskManager)
    result = CliRunner().invoke(health, ["--role", "taskmanager", "--port", port])
    assert (result.exit_code, result.output) == (0, "healthy: taskmanager: registered with the leader\n")


def test_a_closed_port_is_unhealthy_and_says_why() -> None:
    port = free_port()
    ok, line = check(Probe("projector", f"http://127.0.0.1:{port}/metrics"), timeout=2)
    assert not ok and line.startswith(f"projector: http://127.0.0.1:{port}/metrics did not answer: ")
    # python -m sluice.cli.health, as the HEALTHCHECK runs it: here PID 1 is no Sluice service
    done = subprocess.run([sys.executable, "-m", "sluice.cli.health"], capture_output=True, text=True, timeout=30)
    assert done.returncode in (0, 1) and done.stdout.startswith(("healthy: ", "unhealthy: ")), done


def test_a_projector_that_answers_is_well() -> None:
    port = free_port()
    served = serve(ProjectorMetrics(), port, "127.0.0.1")
    try:
        assert check(probe_for(["sluice", "projector", "--metrics-port", str(port)], {})) == (
            True,
            "projector: answering",
        )
    finally:
        served.stop()
