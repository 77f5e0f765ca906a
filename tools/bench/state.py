"""Benchmark of queryable-state lookups against raw redis-py HGET, same server, same run.

    raw HGET     redis-py ``HGET state-hash field`` with the hash and field known in advance
    warm         ``StateClient.get(job, name, key)`` with its location cache filled: the key's
                 key group (Spark's Murmur3, in Python), the range, one HGET, the JSON value
    cold         the same with the cache emptied before every lookup: one more round trip
                 to read the KvStateLocation row from the table, and parsing it

The state is what a keyed vertex of ``parallelism`` subtasks publishes (one hash per
subtask, ``keys`` keys in all), registered through the registry's facts and projected into
the table by the projector. Rounds alternate; the table reports the median round.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import orjson
from rich.table import Table

from sluice.events import (
    Envelope,
    Event,
    JobEdge,
    JobGraph,
    JobSubmitted,
    JobVertex,
    KeyGroupRange,
    NotifyKvStateRegistered,
    SourceSpec,
)
from sluice.services.dataplane.keygroups import key_group_of, key_group_range
from sluice.services.embedded import RedisServer
from sluice.services.kvstate.codec import key_field
from sluice.services.projector import Projector
from sluice.state import StateClient
from sluice.store import EventLog, Keys, KvStates, Out, connect, server_address

from .console import console
from .log import rounds

__all__ = ["run"]

JOB, NAME = "bench-job", "counts"


def run(
    *, keys: int = 100_000, lookups: int = 20_000, parallelism: int = 4, redis_url: str | None = None, n_rounds: int = 7
) -> dict[str, float]:
    server = None
    if redis_url is None:
        server = RedisServer(None)
        redis_url = server.start()
    try:
        return _run(redis_url, keys, lookups, parallelism, n_rounds)
    finally:
        if server is not None:
            server.stop()


def _publish(log: EventLog, url: str, keys: int, parallelism: int, maxp: int = 128) -> list[str]:
    graph = JobGraph(
        "bench",
        [
            JobVertex("src", "source", 1, source=SourceSpec("text", ["/x"], 1)),
            JobVertex("count", "transform", parallelism, ["m:f"], queryable=NAME),
        ],
        [JobEdge("src", "count", "keyed", "word")],
        maxp,
    )
    facts: list[Event] = [JobSubmitted(JOB, graph, "blob", "m", "inbox", {}, {}, "file:///tmp")]
    words = [f"word-{i}" for i in range(keys)]
    store = KvStates(log.backend, log.keys)
    for sub in range(parallelism):
        start, end = key_group_range(maxp, parallelism, sub)
        mine = [w for w in words if start <= key_group_of(w, maxp) <= end]
        sid = f"bench{sub}"
        store.write(JOB, sid, ((w, orjson.dumps({"word": w, "count": len(w)})) for w in mine), {})
        facts.append(
            NotifyKvStateRegistered(
                JOB, "count", KeyGroupRange(start, end), NAME, sid, server_address(url), f"count:{sub}:0"
            )
        )
    tag = log.keys.job(JOB)
    log.commit(tag, 0, [Out(log.keys.facts(tag), Envelope(f, f"b{i}", 0, 1, JOB)) for i, f in enumerate(facts)])
    projector = Projector(log, ())
    projector.add_job(JOB)
    projector.catch_up()
    return words


def _run(url: str, n_keys: int, lookups: int, parallelism: int, n_rounds: int) -> dict[str, float]:
    client = connect(url)
    keys = Keys("bench")
    log = EventLog(client, keys)
    for k in client.scan_iter(match=keys.pattern):
        client.delete(k)
    with console.status(f"publishing {n_keys:,} keys over {parallelism} subtasks"):
        words = _publish(log, url, n_keys, parallelism)
    rng = random.Random(1)
    sample = [rng.choice(words) for _ in range(lookups)]
    state = StateClient(log, catch_up=False)
    # The raw baseline knows each key's hash and field already.
    raw_pairs = []
    for w in sample:
        found = state.lookup(JOB, NAME, w)
        raw_pairs.append((keys.kvstate(keys.job(JOB), found.state_id), "=" + key_field(w)))
    per_round = max(lookups // n_rounds, 1)
    cold_n = max(per_round // 4, 1)

    def raw() -> float:
        t = time.perf_counter()
        for k, f in raw_pairs[:per_round]:
            client.hget(k, f)
        return per_round / (time.perf_counter() - t)

    def warm() -> float:
        state.get(JOB, NAME, sample[0])
        t = time.perf_counter()
        for w in sample[:per_round]:
            state.get(JOB, NAME, w)
        return per_round / (time.perf_counter() - t)

    def cold() -> float:
        t = time.perf_counter()
        for w in sample[:cold_n]:
            state.forget()
            state.get(JOB, NAME, w)
        return cold_n / (time.perf_counter() - t)

    console.print(
        f"[dim]{n_keys:,} keys in {parallelism} state hashes; {n_rounds} alternating rounds of {per_round:,} "
        f"lookups (cold: {cold_n:,})[/]"
    )
    checks: list[tuple[str, Callable[[], float]]] = [("raw", raw), ("warm", warm), ("cold", cold)]
    results = rounds(checks, n_rounds)
    for k in client.scan_iter(match=keys.pattern):
        client.delete(k)

    table = Table(
        title="Queryable state lookups vs raw redis-py HGET (lookups/s, median of rounds; same server, same run)"
    )
    for col in ("path", "lookups/s", "vs raw HGET", "target"):
        table.add_column(col, justify="right")
    table.add_row("raw HGET", f"{results['raw']:,.0f}", "1.00", "")
    for label, key, target in (("client, cache warm", "warm", 0.50), ("client, cache cold", "cold", None)):
        ratio = results[key] / results["raw"]
        mark = "" if target is None else ("[green]" if ratio >= target else "[red]")
        table.add_row(
            label,
            f"{results[key]:,.0f}",
            f"{mark}{ratio:.2f}{'[/]' if mark else ''}",
            f">= {target:.2f}" if target else "",
        )
    console.print(table)
    return results
