"""The bench's CPU meter (tools/bench/cpu.py) against real processes: a busy one, an idle
one, one started inside the measure and one gone before its end."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tools.bench.cpu import CpuMeter, cpu_seconds

BUSY = "while True: pass"
IDLE = "import time; time.sleep(60)"


def _child(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code])


@pytest.fixture
def children():
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def test_each_role_counts_its_own_processes_cpu(children: list[subprocess.Popen]) -> None:
    busy, idle = _child(BUSY), _child(IDLE)
    children += [busy, idle]
    time.sleep(0.3)  # (interpreter start is not measured)
    late: list[subprocess.Popen] = []
    with CpuMeter(
        {"busy": lambda: [busy.pid], "idle": lambda: [idle.pid], "late": lambda: [p.pid for p in late]}
    ) as meter:
        late.append(_child(BUSY))
        children.append(late[0])
        time.sleep(0.6)
    assert meter.seconds["busy"] > 0.1 > meter.seconds["idle"]
    assert meter.seconds["late"] > 0.05  # started inside: all its CPU counts
    assert meter.wall >= 0.6 and meter.cores_busy() > 0.1
    assert meter.per_task_ms(100)["busy"] == pytest.approx(10 * meter.seconds["busy"])


def test_a_process_gone_before_the_end_counts_nothing_and_a_missing_pid_reads_none(
    children: list[subprocess.Popen],
) -> None:
    gone = _child(BUSY)
    time.sleep(0.2)
    with CpuMeter({"gone": lambda: [gone.pid]}) as meter:
        time.sleep(0.2)
        gone.kill()
        gone.wait()
    assert meter.seconds == {"gone": 0.0}
    assert cpu_seconds(gone.pid) is None
