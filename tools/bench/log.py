"""Benchmark of the log against raw redis-py, measured in the same run on the same server.

    append, single   raw: orjson.dumps + XADD, one round trip each
                     Sluice: EventLog.commit of one event (envelope encode + fenced Lua commit)
    append, batched  raw: orjson.dumps + a pipeline of B XADDs
                     Sluice: one fenced commit of B events
    replay           raw: XRANGE pages + orjson.loads of every entry
                     Sluice: EventLog.replay (strict decode into typed events) folded into the
                     membership state with the JobManager's own evolve

Each pair is measured in alternating rounds; the table reports the median round.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import orjson
from rich.table import Table

from sluice.events import Envelope, TaskManagerLost, TaskManagerRegistered, encode
from sluice.services.embedded import RedisServer
from sluice.services.membership.core import Membership, evolve
from sluice.store import EventLog, Keys, Out, connect

from .console import console

__all__ = ["run"]


LABELS = {"zone": "europe-west4-a", "rack": "r17"}


def sample_event(i: int) -> Envelope:
    rid = f"tm-{i % 1000:04d}"
    ev: TaskManagerLost | TaskManagerRegistered
    if i % 3 == 2:
        ev = TaskManagerLost(rid, f"session-{i // 1000:08d}", "no heartbeat for 5012 ms (timeout 5000 ms), worker gone")
    else:
        ev = TaskManagerRegistered(rid, f"session-{i // 1000:08d}", f"worker-{i % 1000:04d}.cluster.local", 4, LABELS)
    return Envelope(ev, f"{i:032x}", 1, 1_700_000_000_000 + i, None, f"{i + 7:032x}")


def sample_dict(i: int) -> dict:
    return orjson.loads(encode(sample_event(i)))


def rounds(pairs: list[tuple[str, Callable[[], float]]], n_rounds: int) -> dict[str, float]:
    """Run each measurement n_rounds times, alternating; return the median rate of each."""
    rates: dict[str, list[float]] = {name: [] for name, _ in pairs}
    for _ in range(n_rounds):
        for name, fn in pairs:
            rates[name].append(fn())
    return {name: statistics.median(r) for name, r in rates.items()}


def run(
    *,
    events: int = 1_000_000,
    appends: int = 20_000,
    batch: int = 100,
    redis_url: str | None = None,
    n_rounds: int = 10,
) -> dict[str, float]:
    server = None
    if redis_url is None:
        server = RedisServer(None)
        redis_url = server.start()
    try:
        return _run(connect(redis_url), events, appends, batch, n_rounds)
    finally:
        if server is not None:
            server.stop()


def _run(client, events: int, appends: int, batch: int, n_rounds: int) -> dict[str, float]:
    keys = Keys("bench")
    log = EventLog(client, keys)
    tag = keys.cluster
    facts = keys.facts(tag)
    raw_stream = tag + ":raw"
    for k in client.scan_iter(match=keys.pattern):
        client.delete(k)
    payload_size = len(encode(sample_event(0)))
    envs = [sample_event(i) for i in range(max(appends, batch))]
    dicts = [sample_dict(i) for i in range(max(appends, batch))]

    per_round = max(appends // n_rounds, 1)

    def raw_single() -> float:
        t = time.perf_counter()
        for d in dicts[:per_round]:
            client.xadd(raw_stream, {b"e": orjson.dumps(d)})
        return per_round / (time.perf_counter() - t)

    def sluice_single() -> float:
        t = time.perf_counter()
        for e in envs[:per_round]:
            log.commit(tag, 1, [Out(facts, e)])
        return per_round / (time.perf_counter() - t)

    n_batches = max(appends * 5 // batch // n_rounds, 1)

    def raw_batched() -> float:
        t = time.perf_counter()
        chunk = dicts[:batch]
        for _ in range(n_batches):
            pipe = client.pipeline(transaction=False)
            for d in chunk:
                pipe.xadd(raw_stream, {b"e": orjson.dumps(d)})
            pipe.execute()
        return n_batches * batch / (time.perf_counter() - t)

    def sluice_batched() -> float:
        t = time.perf_counter()
        chunk = envs[:batch]
        for _ in range(n_batches):
            log.commit(tag, 1, [Out(facts, e) for e in chunk])
        return n_batches * batch / (time.perf_counter() - t)

    console.print(
        f"[dim]payload {payload_size} bytes; {n_rounds} alternating rounds of {per_round} single appends "
        f"and of {n_batches}×{batch} batched; then {max(n_rounds // 3, 1)} rounds of replaying {events:,} events[/]"
    )
    results = rounds(
        [
            ("raw single", raw_single),
            ("sluice single", sluice_single),
            ("raw batched", raw_batched),
            ("sluice batched", sluice_batched),
        ],
        n_rounds,
    )

    # Fill one stream with `events` envelopes (through batched commits), replay it both ways.
    client.delete(facts, raw_stream)
    with console.status(f"writing {events:,} events"):
        for start in range(0, events, 1000):
            log.commit(tag, 1, [Out(facts, sample_event(i)) for i in range(start, min(start + 1000, events))])
    assert log.length(facts) == events

    def raw_replay() -> float:
        t = time.perf_counter()
        n = 0
        start = "-"
        while True:
            page = client.xrange(facts, start, "+", count=1000)
            for _, fields in page:
                orjson.loads(fields[b"e"])
                n += 1
            if len(page) < 1000:
                break
            start = b"(" + page[-1][0]
        assert n == events
        return n / (time.perf_counter() - t)

    def sluice_replay() -> float:
        t = time.perf_counter()
        state = Membership()
        n = 0
        for _, env in log.replay(facts, page=1000):
            evolve(state, env)
            n += 1
        assert n == events and len(state.taskmanagers) == min(events, 1000)
        return n / (time.perf_counter() - t)

    with console.status(f"replaying {events:,} events"):
        results |= rounds([("raw replay", raw_replay), ("sluice replay", sluice_replay)], max(n_rounds // 3, 1))
    client.delete(facts, raw_stream)

    table = Table(title="Sluice log vs raw redis-py (events/s, median of rounds; same server, same run)")
    for col in ("path", "raw redis-py", "Sluice", "Sluice/raw", "target"):
        table.add_column(col, justify="right")
    for label, key, target in (
        ("append, single", "single", 0.70),
        ("append, batched", "batched", 0.80),
        ("replay into state", "replay", 0.60),
    ):
        raw, ours = results[f"raw {key}"], results[f"sluice {key}"]
        ratio = ours / raw
        mark = "[green]" if ratio >= target else "[red]"
        table.add_row(label, f"{raw:,.0f}", f"{ours:,.0f}", f"{mark}{ratio:.2f}[/]", f">= {target:.2f}")
    console.print(table)
    return results
