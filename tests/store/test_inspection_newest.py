"""store.inspection.newest: the N newest entries across many streams, read backwards and
only from the streams that can hold them, equal the brute-force answer."""

from __future__ import annotations

import random

import pytest

from sluice.store import EventLog, entry_order
from sluice.store.inspection import newest


@pytest.mark.parametrize("seed", range(6))
def test_the_newest_entries_across_streams_are_the_brute_force_answer(log: EventLog, seed: int) -> None:
    rng = random.Random(seed)
    streams = [f"{{{log.keys.prefix}:s{i}}}:facts" for i in range(rng.randint(1, 150))]
    ms = 1_000
    for _ in range(rng.randint(0, 600)):
        ms += rng.choice((0, 1, 1, 5))
        s = rng.choice(streams[: rng.randint(1, len(streams))])  # some streams busier, some empty
        log.backend.xadd(s, {b"e": str(ms).encode()})
    everything = sorted(
        ((s, i, f) for s in streams for i, f in log.replay_raw(s)), key=lambda e: (entry_order(e[1]), e[0])
    )
    ids = [i for _, i, _ in everything]
    for count in (0, 1, 7, 100, 10_000):
        for until in (None, rng.choice(ids) if ids else None):
            want = [e for e in everything if until is None or entry_order(e[1]) <= entry_order(until)]
            want = want[-count:] if count else []
            got, last = newest(log, streams, until, count, chunk=rng.choice((1, 3, 64)))
            assert [(s, i) for s, i, _ in got] == [(s, i) for s, i, _ in want]
            assert all(f == dict(wf) for (_, _, f), (_, _, wf) in zip(got, want))
            for s in streams:
                held = [
                    i for t, i, _ in everything if t == s and (until is None or entry_order(i) <= entry_order(until))
                ]
                assert last[s] == (held[-1] if held else None)
