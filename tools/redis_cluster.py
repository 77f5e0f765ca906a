"""A Redis Cluster on loopback (for tests, benchmarks and chaos runs): six ``redis-server
--cluster-enabled yes`` on free ports, made into three masters with a replica each by
``redis-cli --cluster create``.

The test session's fixture ``redis_cluster`` (tests/conftest.py) starts one the first time
a test asks for it (those tests carry the ``cluster`` marker). ``kill_master`` kills -9 the
master that owns a slot, for failover tests; ``wait_stable`` waits until every slot is
served again.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

__all__ = ["LoopbackCluster", "ClusterNode"]


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def cluster_port(taken: set[int]) -> int:
    """A free loopback port whose cluster bus port (10,000 above it) is free too: a cluster
    node's port must be 55535 or less."""
    while True:
        port = random.randint(20_000, 55_535)
        if port not in taken and _free(port) and _free(port + 10_000):
            return port


@dataclass
class ClusterNode:
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"


@dataclass
class LoopbackCluster:
    """``masters`` masters with ``replicas`` replicas each, on free loopback ports, their
    files (nodes.conf, logs) under ``root``."""

    root: Path
    masters: int = 3
    replicas: int = 1
    node_timeout_ms: int = 1000
    nodes: list[ClusterNode] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The Sluice URL of the cluster: every node a seed."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self, timeout: float = 30.0) -> str:
        server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
        if server is None or cli is None:
            raise RuntimeError(
                "redis-server and redis-cli are needed: run scripts/setup (apt-get install redis-server)"
            )
        for _ in range(self.masters * (1 + self.replicas)):
            self.nodes.append(self._spawn(server, cluster_port({n.port for n in self.nodes})))
        for node in self.nodes:
            self._wait(lambda n=node: self._up(n), timeout)
        addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
        made = subprocess.run(
            [cli, "--cluster", "create", *addresses, "--cluster-replicas", str(self.replicas), "--cluster-yes"],
            capture_output=True,
            timeout=timeout,
        )
        if made.returncode != 0:
            self.stop()
            raise RuntimeError(f"redis-cli --cluster create failed: {made.stdout.decode()} {made.stderr.decode()}")
        self.wait_stable(timeout)
        return self.url

    def _spawn(self, server: str, port: int) -> ClusterNode:
        home = self.root / str(port)
        home.mkdir(parents=True, exist_ok=True)
        cmd = [
            server,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            str(self.node_timeout_ms),
            # A shard whose master is down (until its replica is promoted) leaves the
            # other shards serving: the jobs there do not pay for it.
            "--cluster-require-full-coverage",
            "no",
            "--dir",
            str(home),
            "--save",
            "",
            "--appendonly",
            "no",
            "--logfile",
            "redis.log",
            "--daemonize",
            "no",
        ]
        return ClusterNode(port, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def _up(self, node: ClusterNode) -> bool:
        if node.proc.poll() is not None:
            log = (self.root / str(node.port) / "redis.log").read_text(errors="replace")[-2000:]
            self.stop()
            raise RuntimeError(f"a cluster node on port {node.port} exited at start: {log}")
        return bool(redis.Redis(host="127.0.0.1", port=node.port, socket_timeout=1).ping())

    @staticmethod
    def _wait(check: object, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if check():  # type: ignore[operator]
                    return
            except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the loopback cluster did not get ready within {timeout} s")
            time.sleep(0.05)

    def alive(self) -> list[ClusterNode]:
        return [n for n in self.nodes if n.proc.poll() is None]

    def wait_stable(self, timeout: float = 30.0) -> None:
        """Until every live node says the cluster is ok and all of them agree on who serves each slot."""

        def stable() -> bool:
            views = []
            for n in self.alive():
                c = redis.Redis(host="127.0.0.1", port=n.port, socket_timeout=1)
                if c.cluster("info").get("cluster_state") != "ok":
                    return False
                views.append(sorted((s[0], s[1], s[2][1]) for s in c.execute_command("CLUSTER SLOTS")))
            return bool(views) and all(v == views[0] for v in views) and sum(e - b + 1 for b, e, _ in views[0]) == 16384

        self._wait(stable, timeout)

    def owner(self, key: str) -> int:
        """The port of the master serving ``key``'s slot."""
        c = redis.Redis(host="127.0.0.1", port=self.alive()[0].port, socket_timeout=1)
        slot = int(c.execute_command("CLUSTER KEYSLOT", key))
        for begin, end, master, *_ in c.execute_command("CLUSTER SLOTS"):
            if begin <= slot <= end:
                return int(master[1])
        raise RuntimeError(f"no master serves slot {slot}")

    def kill_master(self, key: str) -> int:
        """kill -9 the master serving ``key``; its port."""
        port = self.owner(key)
        node = next(n for n in self.nodes if n.port == port)
        node.proc.kill()
        node.proc.wait()
        return port

    def stop(self) -> None:
        for node in self.nodes:
            if node.proc.poll() is None:
                node.proc.kill()
                node.proc.wait()
        self.nodes.clear()
