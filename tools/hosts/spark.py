"""A Spark standalone cluster across the harness's hosts, from the pip-installed PySpark (its
wheel has no start scripts, so each daemon is ``bin/spark-class`` of its deploy class): a
master on the host ``spark`` and a worker on each TaskManager host, each bound to its host's
address (``--host`` and ``SPARK_LOCAL_IP``), its work directory in the host's directory.

What the TaskManagers use (``Layout.spark``):

* ``local``: each TaskManager's own Spark Connect server runs ``local[*]`` (the harness's
  default; nothing of this module runs);
* ``standalone``: each TaskManager's own Spark Connect server is an application of the
  standalone cluster (``SLUICE_SPARK_MASTER=spark://MASTER:7077``), its driver bound to and
  advertised at its host's address (``SPARK_LOCAL_IP``), so that executors on the other
  hosts reach it;
* ``standalone-shared``: one Spark Connect server on the host ``spark``, an application of
  the same cluster, that every TaskManager's workers use (``SLUICE_SPARK_REMOTE``).

Each application gets ``APP_CORES`` cores (the master's ``spark.deploy.defaultCores``), so
that the application of one TaskManager does not take every core and leave the others'
waiting for executors.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from tools import with_tools

from .host import Host
from .net import HostsError

__all__ = [
    "SPARK_MODES",
    "MASTER_PORT",
    "CONNECT_PORT",
    "check_mode",
    "master_url",
    "daemon_env",
    "start_master",
    "start_worker",
    "start_connect",
    "wait_workers",
    "driver_env",
]

SPARK_MODES = ("local", "standalone", "standalone-shared")
MASTER_PORT = 7077
MASTER_UI_PORT = 8080
WORKER_UI_PORT = 8081
CONNECT_PORT = 15002
APP_CORES = 2
"""Cores each application (a Spark Connect server) takes from the cluster."""
WORKER_MEMORY = "3g"


def check_mode(mode: str) -> str:
    """``mode`` when it is one of ``SPARK_MODES``, else a HostsError naming the choices."""
    if mode not in SPARK_MODES:
        raise HostsError(
            f"Layout.spark is {mode!r}: choose one of {', '.join(SPARK_MODES)} (local: each "
            "TaskManager's own local[*]; standalone: a Spark standalone cluster across the hosts)"
        )
    return mode


def master_url(master: Host) -> str:
    return f"spark://{master.address}:{MASTER_PORT}"


def _spark_home() -> Path:
    from sluice.services.embedded.spark_connect import spark_home

    return spark_home()


def daemon_env(env: Mapping[str, str], host: Host) -> dict[str, str]:
    """The environment of a Spark process on ``host``: bound to and advertised at its address."""
    return {
        **env,
        "SPARK_HOME": str(_spark_home()),
        "SPARK_LOCAL_IP": host.address,
        "SPARK_LOCAL_HOSTNAME": host.address,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }


def driver_env(host: Host, master: Host) -> dict[str, str]:
    """What a TaskManager on ``host`` adds to its environment so that the Spark Connect server it
    starts is an application of the cluster whose driver the other hosts' executors reach."""
    return {
        "SLUICE_SPARK_MASTER": master_url(master),
        "SPARK_LOCAL_IP": host.address,
        "SPARK_LOCAL_HOSTNAME": host.address,
    }


def _spawn(host: Host, argv: list[str], env: Mapping[str, str], name: str) -> subprocess.Popen[bytes]:
    return host.spawn(argv, log=host.directory / f"{name}.log", env=daemon_env(env, host), clock=False)


def start_master(host: Host, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """The standalone master on ``host`` (not awaited: ``wait_workers`` waits for it)."""
    env = {**env, "SPARK_MASTER_OPTS": f"-Dspark.deploy.defaultCores={APP_CORES}"}
    return _spawn(
        host,
        [
            str(_spark_home() / "bin" / "spark-class"),
            "org.apache.spark.deploy.master.Master",
            "--host",
            host.address,
            "--port",
            str(MASTER_PORT),
            "--webui-port",
            str(MASTER_UI_PORT),
        ],
        env,
        "spark-master",
    )


def start_worker(host: Host, master: Host, env: Mapping[str, str], cores: int) -> subprocess.Popen[bytes]:
    """A standalone worker of ``cores`` cores on ``host``, its executors' files in the host's directory."""
    work = host.directory / "spark-work"
    work.mkdir(parents=True, exist_ok=True)
    return _spawn(
        host,
        [
            str(_spark_home() / "bin" / "spark-class"),
            "org.apache.spark.deploy.worker.Worker",
            "--host",
            host.address,
            "--cores",
            str(cores),
            "--memory",
            WORKER_MEMORY,
            "--webui-port",
            str(WORKER_UI_PORT),
            "--work-dir",
            str(work),
            master_url(master),
        ],
        env,
        "spark-worker",
    )


def alive_workers(master: Host) -> int:
    """The workers the master counts ALIVE (0 when it does not answer yet)."""
    try:
        with urllib.request.urlopen(f"http://{master.address}:{MASTER_UI_PORT}/json/", timeout=2) as r:
            return int(json.load(r).get("aliveworkers", 0))
    except (OSError, ValueError):
        return 0


def wait_workers(master: Host, want: int, procs: Mapping[str, subprocess.Popen[bytes]], timeout: float) -> None:
    """Return once the master counts ``want`` live workers; a HostsError naming the log of a
    daemon that exited, or what the master counts after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while (alive := alive_workers(master)) < want:
        for name, proc in procs.items():
            if proc.poll() is not None:
                raise HostsError(
                    f"the Spark {name} exited ({proc.returncode}) at start; see its log, "
                    f"spark-*.log in the host directories under {master.directory.parent}"
                )
        if time.monotonic() > deadline:
            raise HostsError(
                f"the Spark master on host {master.name} counts {alive} live workers of {want} after "
                f"{timeout:.0f} s; see spark-master.log and spark-worker.log under "
                f"{master.directory.parent}"
            )
        time.sleep(0.5)


def start_connect(
    host: Host, master: Host, env: Mapping[str, str], timeout: float
) -> tuple[subprocess.Popen[bytes], str]:
    """A Spark Connect server on ``host``, an application of the cluster, listening on the host's
    address; (its process, its ``sc://`` URL), once it listens."""
    log = host.directory / "spark-connect.log"
    url = f"sc://{host.address}:{CONNECT_PORT}"
    argv = [sys.executable, "-m", "tools.hosts.spark", master_url(master), str(CONNECT_PORT), host.address, str(log)]
    proc = host.spawn(
        argv, log=host.directory / "spark-connect-launcher.log", env=with_tools(daemon_env(env, host)), clock=False
    )
    deadline = time.monotonic() + timeout
    probe = f"</dev/tcp/{host.address}/{CONNECT_PORT}"
    while host.run("bash", "-c", probe, check=False).returncode != 0:
        if proc.poll() is not None:
            raise HostsError(
                f"the shared Spark Connect server on host {host.name} exited ({proc.returncode}); see "
                f"{host.directory}/spark-connect.log"
            )
        if time.monotonic() > deadline:
            raise HostsError(
                f"the shared Spark Connect server on host {host.name} did not listen within "
                f"{timeout:.0f} s; see {host.directory}/spark-connect.log"
            )
        time.sleep(0.5)
    return proc, url


def worker_cores() -> int:
    """Cores each worker offers: this machine's (the hosts share its cores)."""
    return os.cpu_count() or 2


def serve(master: str, port: int, host: str, log: Path) -> int:
    """Run a Spark Connect server of ``master`` on ``host:port`` until it exits (what
    ``start_connect`` runs on the host: ``python -m tools.hosts.spark MASTER PORT HOST LOG``)."""
    from sluice.services.embedded.spark_connect import SparkConnectServer

    server = SparkConnectServer(master=master, port=port, host=host, log_file=log)
    server.start(wait=False)
    assert server.proc is not None
    return server.proc.wait()


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1], int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])))
