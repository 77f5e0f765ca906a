"""The cold-start bench's own parts: it finds a Spark server below the process it times by
the port on its command line and notes when that port first listens; bad --variants are
named."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from click.testing import CliRunner

from sluice.services.embedded import free_port
from tools.bench.cli import bench
from tools.bench.coldstart import Timeline, _SparkWatch

# A stand-in for `sluice run`: a child whose command line names a Spark Connect port, as
# spark-submit's does, and that listens on it after a while, as a JVM coming up does.
_PARENT = textwrap.dedent("""
    import subprocess, sys
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1], "--conf",
                              f"spark.connect.grpc.binding.port={sys.argv[2]}"])
    child.wait()
""")
_SERVER = textwrap.dedent("""
    import socket, sys, time
    port = int(sys.argv[-1].split("=")[1])
    time.sleep(0.8)
    s = socket.socket(); s.bind(("127.0.0.1", port)); s.listen()
    time.sleep(2.0)
""")


def test_the_watch_notes_when_a_spark_port_below_the_process_first_listens() -> None:
    port = free_port()
    began = time.time()
    proc = subprocess.Popen([sys.executable, "-c", _PARENT, _SERVER, str(port)])
    with _SparkWatch(proc.pid, every=0.02) as watch:
        proc.wait(timeout=30)
    assert list(watch.listening) == [port]
    assert watch.listening[port] - began >= 0.8  # not before it listened (a connection made it: while it did)


def test_the_first_task_is_counted_from_the_first_server_listening() -> None:
    t = Timeline(30.0, listening=[9.0, 12.5], first_split=10.2)
    assert t.first_task_after_listening is not None and abs(t.first_task_after_listening - 1.2) < 1e-9
    assert Timeline(30.0, listening=[], first_split=10.2).first_task_after_listening is None
    assert Timeline(30.0, listening=[9.0]).first_task_after_listening is None


def test_a_bad_variant_is_named() -> None:
    result = CliRunner().invoke(bench, ["coldstart", "--variants", "2:two-jvms"])
    assert result.exit_code != 0
    assert "--variants item '2:two-jvms' must look like 2:shared or 2:per-taskmanager" in str(result.exception)
