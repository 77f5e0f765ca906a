"""The log on a Redis Cluster vs on one Redis, in the same run (``scripts/bench cluster-log``).

Three ways to the same log, each measured in alternating rounds (the table reports the
median round, and each path's rate over the single node's):

    single node        RedisBackend on one redis-server (the baseline)
    cluster, own       ClusterBackend: slot routing over per-node RedisBackends (what Sluice uses)
    cluster, redis-py  the commit's script sent through redis-py's RedisCluster
                       (``evalsha`` on the client: its routing, its per-command machinery)

What is timed:

    commit, 1 event    EventLog.commit of one event (envelope encode + the fenced Lua commit),
                       each to one of 64 jobs' tags (the cluster spreads them over its masters)
    commit, 100 events one commit of 100 events
    read 64 inboxes    a leader's non-blocking read of 64 job inboxes through its consumer
                       group, 10 new entries in each (one XREADGROUP on one node; per slot,
                       pipelined per node, on the cluster)
    replay             EventLog.replay of one job's facts (XRANGE pages, decoded)

The cluster runs on the same machine (three masters, three replicas, loopback): it shows
what routing costs, not what sharding gains (that needs hosts of their own).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis
from rich.table import Table

from sluice.events import Envelope
from sluice.services.embedded import RedisServer
from sluice.store import ClusterBackend, EventLog, GroupConsumer, Keys, Out, RedisBackend, connect
from sluice.store.backend import Delegating
from sluice.store.scripts import BY_NAME
from tools.bench.log import sample_event
from tools.redis_cluster import LoopbackCluster

from .console import console

__all__ = ["run"]

JOBS = 64


class RedisPyCluster(Delegating):
    """The commit path through redis-py's RedisCluster: every script goes as ``evalsha`` on
    its client (redis-py routes it by its first key); everything else goes to ``inner``."""

    def __init__(self, inner: ClusterBackend, url: str) -> None:
        super().__init__(inner)
        self.cluster = inner
        host, _, port = url.removeprefix("redis+cluster://").split(",")[0].rpartition(":")
        self.rc = redis.RedisCluster(host=host, port=int(port))
        self.shas = {name: self.rc.script_load(text) for name, text in BY_NAME.items()}

    def script(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        # (the cluster's server id becomes the node's run id, as ClusterBackend does it)
        args = self.cluster._for_node(self.cluster.node_of(keys[0]), args)
        try:
            return self.rc.evalsha(self.shas[name], len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            return self.rc.eval(BY_NAME[name], len(keys), *keys, *args)


def job_tags(log: EventLog) -> list[str]:
    """The tags of the bench's ``JOBS`` jobs (spread over a cluster's slots by their ids)."""
    return [log.keys.job(f"job-{i:03d}") for i in range(JOBS)]


def commit_rates(
    name: str, log: EventLog, envs: list[Envelope], per_round: int
) -> list[tuple[str, Callable[[], float]]]:
    """Two rates of ``log``'s commits (events a second), named ``<name>|commit, 1 event`` and
    ``<name>|commit, 100 events``: ``per_round`` commits of one event over the jobs' tags in
    turn, and a twentieth as many of 100 events."""
    tags, server = job_tags(log), log.server_id()

    def single() -> float:
        t = time.perf_counter()
        for i, e in enumerate(envs[:per_round]):
            tag = tags[i % JOBS]
            log.commit(tag, 1, [Out(log.keys.facts(tag), e)], server=server)
        return per_round / (time.perf_counter() - t)

    def batched() -> float:
        n = max(per_round // 20, 1)
        t = time.perf_counter()
        for i in range(n):
            tag = tags[i % JOBS]
            log.commit(tag, 1, [Out(log.keys.facts(tag), e) for e in envs[:100]], server=server)
        return n * 100 / (time.perf_counter() - t)

    return [(f"{name}|commit, 1 event", single), (f"{name}|commit, 100 events", batched)]


def median_rounds(
    pairs: list[tuple[str, Callable[[], float]]], n_rounds: int, *, warm_up: bool = False
) -> dict[str, float]:
    """Each named rate measured ``n_rounds`` times, alternating, and its median (``warm_up``:
    each run once first, unmeasured: scripts loaded, connections made)."""
    if warm_up:
        for _, fn in pairs:
            fn()
    rates: dict[str, list[float]] = {name: [] for name, _ in pairs}
    for _ in range(n_rounds):
        for name, fn in pairs:
            rates[name].append(fn())
    return {name: statistics.median(r) for name, r in rates.items()}


def run(*, commits: int = 3000, n_rounds: int = 5, replay: int = 20_000) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="sluice-bench-cluster-") as tmp:
        single = RedisServer(None)
        cluster = LoopbackCluster(Path(tmp))
        try:
            url = single.start()
            with console.status("starting a 3-master, 3-replica loopback Redis Cluster"):
                cluster.start()
            logs = {
                "single node": EventLog(RedisBackend(connect(url)), Keys("bench")),
                "cluster, own": EventLog(ClusterBackend(cluster.url), Keys("bench")),
                "cluster, redis-py": EventLog(
                    RedisPyCluster(ClusterBackend(cluster.url), cluster.url), Keys("bench-rc")
                ),
            }
            return _run(logs, commits, n_rounds, replay)
        finally:
            cluster.stop()
            single.stop()


def _run(logs: dict[str, EventLog], commits: int, n_rounds: int, replay: int) -> dict[str, float]:
    envs = [sample_event(i) for i in range(max(commits, 100))]
    per_round = max(commits // n_rounds, 1)
    pairs: list[tuple[str, Callable[[], float]]] = []
    for name, log in logs.items():
        tags = job_tags(log)
        inboxes = [log.keys.inbox(t) for t in tags]
        consumer = GroupConsumer(log, inboxes, "bench", "c")
        consumer.ensure_group()

        def reads(log: EventLog = log, inboxes: list[str] = inboxes, consumer: GroupConsumer = consumer) -> float:
            log.append_each([(s, envs[j]) for s in inboxes for j in range(10)])
            t = time.perf_counter()
            got = consumer.read(count=100, block_ms=None)
            took = time.perf_counter() - t
            assert len(got) == 10 * JOBS, len(got)
            for s in inboxes:
                consumer.ack(*[e.id for e in got if e.stream == s], stream=s)
            return len(got) / took

        pairs += commit_rates(name, log, envs, per_round)
        if name != "cluster, redis-py":  # (its reads are the inner ClusterBackend's: only commits differ)
            pairs += [(f"{name}|read {JOBS} inboxes", reads)]

    console.print(
        f"[dim]{n_rounds} alternating rounds: {per_round} single commits over {JOBS} jobs' tags, "
        f"{max(per_round // 20, 1)} commits of 100 events, a read of {JOBS} inboxes x 10 entries; "
        f"then replays of {replay:,} events[/]"
    )
    results = median_rounds(pairs, n_rounds)

    replays: list[tuple[str, Callable[[], float]]] = []
    for name, log in logs.items():
        if name == "cluster, redis-py":
            continue
        tag = log.keys.job("replayed")
        facts = log.keys.facts(tag)
        for start in range(0, replay, 1000):
            log.commit(tag, 1, [Out(facts, sample_event(i)) for i in range(start, min(start + 1000, replay))])

        def replayed(log: EventLog = log, facts: str = facts) -> float:
            t = time.perf_counter()
            n = sum(1 for _ in log.replay(facts, page=1000))
            assert n == replay
            return n / (time.perf_counter() - t)

        replays.append((f"{name}|replay", replayed))
    results |= median_rounds(replays, max(n_rounds // 2, 1))

    names = list(logs)
    table = Table(title="The log on a Redis Cluster vs one Redis (per second, median of rounds; same run, loopback)")
    table.add_column("path", justify="left")
    for name in names:
        table.add_column(name, justify="right")
    for name in names[1:]:
        table.add_column(f"{name} / single", justify="right")
    for path in ("commit, 1 event", "commit, 100 events", f"read {JOBS} inboxes", "replay"):
        rates = [results.get(f"{name}|{path}") for name in names]
        base = rates[0] or 1.0
        cells = [f"{r:,.0f}" if r is not None else "-" for r in rates]
        ratios = [f"{r / base:.2f}" if r is not None else "-" for r in rates[1:]]
        table.add_row(path, *cells, *ratios)
    console.print(table)
    for log in logs.values():
        for key in log.backend.scan_keys("{bench*"):
            log.backend.delete(key)
        log.backend.close()
    return results
