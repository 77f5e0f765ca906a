"""What ``SLUICE_REDIS_WAIT_REPLICAS`` costs (``scripts/bench wait``): commits on a loopback
Redis Cluster with and without WAIT, in the same run.

    cluster              ClusterBackend, each commit acknowledged by its master (the baseline)
    cluster, WAIT 1      the same, each commit followed on its connection by WAIT 1 <timeout>:
                         acknowledged once the master's replica has it (store/wait.py)

What is timed: ``EventLog.commit`` of one event to one of 64 jobs' tags (spread over the
three masters), and of 100 events, alternating rounds; the table gives the median round and
each rate over the baseline's. The replicas are on the same machine (loopback): WAIT costs
here at least a round trip from master to replica and back, on a network more.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rich.table import Table

from sluice.store import ClusterBackend, EventLog, Keys
from sluice.store.wait import Wait
from tools.bench.cluster_log import commit_rates, median_rounds
from tools.bench.log import sample_event
from tools.redis_cluster import LoopbackCluster

from .console import console

__all__ = ["run"]


def run(*, commits: int = 3000, n_rounds: int = 5, timeout_ms: int = 1000) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="sluice-bench-wait-") as tmp:
        cluster = LoopbackCluster(Path(tmp))
        try:
            with console.status("starting a 3-master, 3-replica loopback Redis Cluster"):
                cluster.start()
                replicas_in_sync(cluster)
            plain = EventLog(ClusterBackend(cluster.url), Keys("bench-plain"))
            waiting = EventLog(ClusterBackend(cluster.url), Keys("bench-wait"))
            waiting.wait = Wait(replicas=1, timeout_ms=timeout_ms)
            return _run({"cluster": plain, "cluster, WAIT 1": waiting}, commits, n_rounds)
        finally:
            cluster.stop()


def replicas_in_sync(cluster: LoopbackCluster, timeout: float = 60.0) -> None:
    """Until every master has a replica online (the first sync waits repl-diskless-sync-delay)."""
    import redis

    deadline = time.monotonic() + timeout
    while True:
        behind = []
        for node in cluster.alive():
            info = redis.Redis(host="127.0.0.1", port=node.port, socket_timeout=1).info("replication")
            if info.get("role") == "master" and not any(
                isinstance(v, dict) and v.get("state") == "online" for k, v in info.items() if k.startswith("slave")
            ):
                behind.append(node.port)
        if not behind:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the masters on ports {behind} have no replica in sync after {timeout} s")
        time.sleep(0.1)


def _run(logs: dict[str, EventLog], commits: int, n_rounds: int) -> dict[str, float]:
    envs = [sample_event(i) for i in range(max(commits, 100))]
    per_round = max(commits // n_rounds, 1)
    pairs: list[tuple[str, Callable[[], float]]] = []
    for name, log in logs.items():
        pairs += commit_rates(name, log, envs, per_round)
    result = median_rounds(pairs, n_rounds, warm_up=True)
    table = Table(title="Commits with and without WAIT on a loopback Redis Cluster (3 masters, 3 replicas)")
    table.add_column("what")
    for name in logs:
        table.add_column(f"{name} (events/s)", justify="right")
    table.add_column("WAIT 1 / plain", justify="right")
    for what in ("commit, 1 event", "commit, 100 events"):
        row = [result[f"{name}|{what}"] for name in logs]
        table.add_row(what, *(f"{r:,.0f}" for r in row), f"{row[1] / row[0]:.2f}x")
    console.print(table)
    return result
