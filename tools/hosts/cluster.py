"""A Sluice cluster across hosts: SeaweedFS on ``storage``, Redis (AOF) on ``redis``, a
JobManager on each of ``jm1`` and ``jm2`` (one leads, one stands by; the projector runs on
``jm2``), and ``tm1``..``tmN``, each with its own TaskManager, slot workers and Spark Connect
server (the TaskManager starts it, ``local[*]``, when a task first needs Spark). Every
process is a real CLI entry point (``.venv/bin/sluice ...``) configured through the
environment, as an operator would run it on separate machines.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from sluice.store import EventLog, Keys, connect, current_leader
from tools import with_tools
from tools.chaos import procs
from tools.chaos.cluster import Timing, poll

from . import net, spark, storage
from .cleanup import clean
from .host import Host
from .net import HostsError
from .state import STATE_DIR, RunState

__all__ = ["Layout", "HostsCluster", "advertise"]

REDIS_PORT = 6379
PROXY_PORT = 16379


def advertise(host: Host) -> list[str]:
    """How a TaskManager on ``host`` names itself to the others: today ``--host`` (locality and
    the views); the one place to switch to the bind/advertise settings once they exist."""
    return ["--host", host.namespace]


@dataclass(frozen=True)
class Layout:
    taskmanagers: int = 3
    slots: int = 2
    private_storage: bool = False
    """Each host gets a private directory at the shared path instead of SeaweedFS (negative control)."""
    proxied: tuple[str, ...] = ()
    """Hosts whose Redis traffic goes through a delay proxy of their own (``faults.latency``)."""
    timing: Timing = Timing()
    skew: dict[str, str] = field(default_factory=dict)
    """Host name -> faketime offset (e.g. ``+30s``) its processes start with."""
    bare: bool = False
    """Only the hosts (namespaces, private ``/tmp``, the bridge): no SeaweedFS, Redis or Sluice;
    the caller starts what runs on them (the README's multi-host section, followed by a test)."""
    spark: str = "local"
    """The TaskManagers' Spark (``spark.SPARK_MODES``): ``local`` (each its own ``local[*]``), ``standalone``
    (a master on host ``spark``, a worker on each TaskManager host, each TaskManager's own Connect server an
    application of it) or ``standalone-shared`` (one Connect server on host ``spark`` for every TaskManager)."""

    def __post_init__(self) -> None:
        spark.check_mode(self.spark)


@dataclass
class Role:
    role: str
    args: tuple[str, ...]
    name: str


@dataclass
class HostsCluster:
    layout: Layout = Layout()
    run: str = field(default_factory=lambda: secrets.token_hex(3))
    hosts: dict[str, Host] = field(default_factory=dict)
    roles: dict[str, list[Role]] = field(default_factory=dict)
    popen: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    state: RunState | None = None
    timings: dict[str, float] = field(default_factory=dict)
    spark_remote: str = ""
    """The shared Spark Connect server's URL (``Layout.spark == "standalone-shared"``)."""

    # --- where things are ----------------------------------------------------------------

    @property
    def directory(self) -> Path:
        return STATE_DIR / self.run

    @property
    def shared(self) -> str:
        """The path every host sees the shared filesystem at."""
        return str(self.directory / "shared")

    @property
    def storage_root(self) -> str:
        return f"file://{self.shared}/storage"

    @property
    def prefix(self) -> str:
        return f"slh{self.run}"

    @property
    def redis_url(self) -> str:
        return f"redis://{self.hosts['redis'].address}:{REDIS_PORT}/0"

    @property
    def s3_endpoint(self) -> str:
        """SeaweedFS's S3 gateway (no credentials configured: anonymous access)."""
        return f"http://{self.hosts['storage'].address}:{storage.S3_PORT}"

    def host_named(self, namespace: str) -> Host:
        """The host whose namespace (what TaskManagers report as their host) is ``namespace``."""
        for host in self.hosts.values():
            if host.namespace == namespace:
                return host
        raise HostsError(f"no host {namespace!r} in run {self.run}")

    def listdir(self, namespace: str, path: str) -> list[str]:
        """The names in directory ``path`` as the host ``namespace`` sees it ([] when it is not there)."""
        done = self.host_named(namespace).run("ls", "-1", path, check=False)
        return done.stdout.split() if done.returncode == 0 else []

    def url_for(self, host: Host) -> str:
        if host.name in self.layout.proxied:
            return f"redis://127.0.0.1:{PROXY_PORT}/0"
        return self.redis_url

    def taskmanager_hosts(self) -> list[Host]:
        return [h for n, h in self.hosts.items() if n.startswith("tm")]

    def log_file(self, host: str, name: str) -> Path:
        return self.hosts[host].directory / f"{name}.log"

    # --- up ------------------------------------------------------------------------------

    def up(self, *, timeout: float = 180.0) -> HostsCluster:
        t0 = time.monotonic()
        self.state = RunState(self.run, procs.ident(os.getpid()) or (os.getpid(), 0), str(self.directory))
        self.directory.mkdir(parents=True, exist_ok=True)
        self.state.save()
        try:
            self._network()
            self.timings["network_s"] = time.monotonic() - t0
            if not self.layout.bare:
                self._storage()
                self.timings["storage_s"] = time.monotonic() - t0 - self.timings["network_s"]
                if self.layout.spark != "local":
                    t1 = time.monotonic()
                    self._spark(timeout)
                    self.timings["spark_s"] = time.monotonic() - t1
                self._sluice(timeout)
        except BaseException:
            self.down()
            raise
        self.timings["up_s"] = time.monotonic() - t0
        return self

    def _network(self) -> None:
        assert self.state is not None
        subnet = net.free_subnet()
        bridge = f"slh{self.run}br"
        self.state.bridge, self.state.subnet = bridge, str(subnet)
        self.state.links.append(bridge)
        self.state.save()
        net.make_bridge(bridge, subnet)
        names = (
            ["storage", "redis", "jm1", "jm2"]
            + (["spark"] if self.layout.spark != "local" else [])
            + [f"tm{i + 1}" for i in range(self.layout.taskmanagers)]
        )
        for i, name in enumerate(names):
            host = Host(
                name,
                f"slh-{self.run}-{name}",
                f"slh{self.run}{i}",
                str(subnet.network_address + 2 + i),
                self.directory / name,
                clock_offset=self.layout.skew.get(name),
            )
            host.directory.mkdir(parents=True, exist_ok=True)
            self.state.namespaces.append(host.namespace)
            self.state.links.append(host.veth)
            self.state.save()
            net.add_host(host.namespace, host.veth, bridge, host.address, subnet.prefixlen)
            host.start_holder()
            self.state.holders[name] = procs.ident(host.holder) or (host.holder, 0)
            self.state.save()
            self.hosts[name] = host

    def _track(self, name: str, proc: subprocess.Popen[bytes]) -> None:
        assert self.state is not None
        self.popen[name] = proc
        who = procs.ident(proc.pid)
        if who is not None:
            self.state.pids.append(who)
            self.state.save()

    def _storage(self) -> None:
        Path(self.shared).mkdir(parents=True, exist_ok=True)
        if self.layout.private_storage:
            for host in self.hosts.values():
                if host.name != "storage":
                    storage.mount_private(host, self.shared)
            return
        server = self.hosts["storage"]
        self._track("weed-server", storage.start_server(server, server.directory / "data"))
        for host in self.hosts.values():
            if host.name != "storage":
                self._track(f"weed-mount-{host.name}", storage.mount(host, server.address, self.shared))

    def env(self, host: Host) -> dict[str, str]:
        return {
            **os.environ,
            **self.layout.timing.env(),
            "SLUICE_REDIS_URL": self.url_for(host),
            "SLUICE_PREFIX": self.prefix,
            "SLUICE_HOME": str(host.directory / "home"),
            "SLUICE_STORAGE_ROOT": self.storage_root,
            **self.spark_env(host),
        }

    def spark_env(self, host: Host) -> dict[str, str]:
        """What a TaskManager on ``host`` is told of Spark beyond its own ``local[*]`` (``Layout.spark``)."""
        if self.layout.spark == "local" or not host.name.startswith("tm"):
            return {}
        if self.layout.spark == "standalone-shared":
            return {"SLUICE_SPARK_REMOTE": self.spark_remote}
        return spark.driver_env(host, self.hosts["spark"])

    def _spark(self, timeout: float) -> None:
        """The standalone cluster (``tools.hosts.spark``): its master, a worker on each TaskManager
        host, and with ``standalone-shared`` the one Connect server; returns once they all serve."""
        master = self.hosts["spark"]
        self._track("spark-master", spark.start_master(master, os.environ))
        workers = {}
        for host in self.taskmanager_hosts():
            workers[f"worker of {host.name}"] = spark.start_worker(host, master, os.environ, spark.worker_cores())
            self._track(f"spark-worker-{host.name}", workers[f"worker of {host.name}"])
        spark.wait_workers(master, len(workers), {"master": self.popen["spark-master"], **workers}, timeout)
        if self.layout.spark == "standalone-shared":
            proc, self.spark_remote = spark.start_connect(master, master, os.environ, timeout)
            self._track("spark-connect", proc)

    def _sluice(self, timeout: float) -> None:
        redis = self.hosts["redis"]
        data = redis.directory / "data"
        data.mkdir(parents=True, exist_ok=True)
        self._track(
            "redis",
            redis.spawn(
                [
                    "redis-server",
                    "--bind",
                    f"{redis.address} 127.0.0.1",
                    "--port",
                    str(REDIS_PORT),
                    "--protected-mode",
                    "no",
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    "everysec",
                    "--save",
                    "",
                    "--dir",
                    str(data),
                ],
                log=redis.directory / "redis.log",
            ),
        )
        client = poll(lambda: connect(self.redis_url), 30)
        if client is None:
            raise HostsError(f"redis-server on host redis did not answer within 30 s; see {redis.directory}/redis.log")
        self.client = client
        self.log = EventLog(client, Keys(self.prefix))
        self.roles = {
            "jm1": [Role("jobmanager", ("--id", "jm1"), "jm1")],
            "jm2": [Role("jobmanager", ("--id", "jm2"), "jm2"), Role("projector", (), "projector")],
        }
        for host in self.taskmanager_hosts():
            self.roles[host.name] = [
                Role(
                    "taskmanager",
                    ("--slots", str(self.layout.slots), "--resource-id", host.name, *advertise(host)),
                    host.name,
                )
            ]
        for name in self.roles:
            self.start_roles(name)
        want = len(self.taskmanager_hosts())
        if not poll(lambda: self.leader() is not None and len(self.registered()) >= want, timeout, every=0.2):
            raise HostsError(
                f"the cluster of run {self.run} did not come up within {timeout:.0f} s: leader "
                f"{self.leader()}, registered {sorted(self.registered())}; logs in {self.directory}"
            )

    def _proxy(self, host: Host, timeout: float = 20.0) -> None:
        """The host's delay proxy to Redis (on its loopback), started and listening."""
        redis = self.hosts["redis"]
        proc = host.spawn(
            [
                sys.executable,
                "-m",
                "tools.hosts.proxy",
                "--listen",
                f"127.0.0.1:{PROXY_PORT}",
                "--to",
                f"{redis.address}:{REDIS_PORT}",
                "--delay-file",
                str(host.directory / "delay"),
            ],
            log=host.directory / "proxy.log",
            env=with_tools(),
            clock=False,
        )
        self._track(f"proxy-{host.name}", proc)
        listening = f"</dev/tcp/127.0.0.1/{PROXY_PORT}"
        if not poll(
            lambda: proc.poll() is None and host.run("bash", "-c", listening, check=False).returncode == 0, timeout
        ):
            raise HostsError(
                f"the delay proxy of host {host.name} did not listen within {timeout:.0f} s; "
                f"see {host.directory}/proxy.log"
            )

    def start_roles(self, host_name: str) -> None:
        """(Re)start the Sluice processes of a host (after ``faults.kill_host``, or with a new clock)."""
        host = self.hosts[host_name]
        proxy = self.popen.get(f"proxy-{host_name}")
        if host_name in self.layout.proxied and (proxy is None or proxy.poll() is not None):
            self._proxy(host)
        exe = str(Path(sys.executable).with_name("sluice"))
        for r in self.roles.get(host_name, []):
            self._track(
                r.name, host.spawn([exe, r.role, *r.args], log=host.directory / f"{r.name}.log", env=self.env(host))
            )

    # --- what the log says ---------------------------------------------------------------

    def leader(self) -> str | None:
        holder = current_leader(self.log)
        return holder.holder if holder is not None else None

    def registered(self) -> set[str]:
        from sluice.views.taskmanagers import taskmanagers

        return {r["resource_id"] for r in taskmanagers(self.log) if r["state"] == "REGISTERED"}

    # --- down ----------------------------------------------------------------------------

    def down(self, *, keep_logs: Path | None = None) -> list[str]:
        """Remove everything this run made; what could not be removed (empty: all gone). With
        ``keep_logs``, every host's logs are copied there first (a failed test's evidence)."""
        t0 = time.monotonic()
        if self.state is None:
            return []
        if keep_logs is not None:
            for log in self.directory.glob("*/**/*.log"):
                if not log.is_relative_to(self.shared):
                    target = keep_logs / log.relative_to(self.directory)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(log, target)
        client = getattr(self, "client", None)
        if client is not None:
            client.close()
        left = clean(self.state, hosts=list(self.hosts.values()))
        self.timings["down_s"] = time.monotonic() - t0
        return left

    def rss_mb(self) -> float:
        """Resident memory of every process of every host, holders included (MB)."""
        total = 0
        for host in self.hosts.values():
            for pid in [host.holder, *host.pids()]:
                try:
                    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                        if line.startswith("VmRSS:"):
                            total += int(line.split()[1])
                except OSError:
                    continue
        return total / 1024
