"""The chaos suite's seeded parts: its plan of strikes and its workload (no cluster)."""

from __future__ import annotations

import zlib
from collections import Counter
from pathlib import Path

import pytest

from tools.chaos.kinds import KINDS, Kind, fsync_policy, plan
from tools.chaos.workload import expected, generate

pytestmark = pytest.mark.chaos


def test_a_seed_replays_its_plan() -> None:
    assert plan(7, 4) == plan(7, 4)
    assert plan(7, 4) != plan(8, 4)


def test_consecutive_seeds_strike_every_kind_evenly() -> None:
    """25 runs of 4 strikes (100 strikes) hit each of the six kinds at least 10 times, and
    Redis restarts happen under both fsync policies."""
    strikes = Counter(s.kind for seed in range(1, 26) for s in plan(seed, 4))
    assert sum(strikes.values()) == 100
    assert set(strikes) == set(KINDS) and min(strikes.values()) >= 10, strikes
    policies = {fsync_policy(seed) for seed in range(1, 26) for s in plan(seed, 4) if s.kind is Kind.REDIS_RESTART}
    assert policies == {"always", "everysec"}


def test_two_runs_of_three_strikes_cover_every_kind() -> None:
    assert {s.kind for seed in (0, 1) for s in plan(seed, 3)} == set(KINDS)


def test_the_workload_has_100k_keys_skewed_and_its_result_adds_up(tmp_path: Path) -> None:
    w = generate(tmp_path / "in.txt", 3)
    assert w.path.read_bytes() == generate(tmp_path / "again.txt", 3).path.read_bytes()
    assert w.bytes < 8 << 20
    counts = Counter(w.path.read_text().split())
    assert len(counts) >= 100_000
    top = counts.most_common(1)[0][1]
    assert top > 100 * (w.tokens / len(counts))  # Zipf: the hottest key is far above the mean
    rows = expected(w.path)
    assert sum(n * words for n, words, _ in rows) == w.tokens
    assert sum(words for _, words, _ in rows) == len(counts)
    assert sum(crc for _, _, crc in rows) == sum(zlib.crc32(k.encode()) for k in counts)
