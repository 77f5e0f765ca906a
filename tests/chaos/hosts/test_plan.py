"""The campaign across hosts: its seeded plan (no cluster)."""

from __future__ import annotations

from collections import Counter

import pytest

from tools.chaos.hosts.kinds import KINDS, HostKind, plan


def _plan(seed: int, taskmanagers: int = 2):
    return plan(seed, taskmanagers=taskmanagers, heartbeat_timeout_s=4.0, lease_ttl_s=3.0)


def test_a_seed_replays_its_plan_and_consecutive_seeds_cover_the_kinds_evenly() -> None:
    assert _plan(7) == _plan(7)
    kinds = Counter(_plan(seed).kind for seed in range(40, 82))
    assert set(kinds) == set(KINDS) and set(kinds.values()) == {7}, kinds


def test_each_fault_has_the_sizes_the_issue_asks_for() -> None:
    plans = [_plan(seed, 3) for seed in range(300)]
    for s in plans:
        if s.kind is HostKind.TM_CUT:
            assert s.target in {"tm1", "tm2", "tm3"} and s.hold_s > 4.0 + 1.9  # past the heartbeat timeout
        elif s.kind is HostKind.JM_CUT:
            assert s.target == "leader" and s.hold_s > 3.0 + 1.9  # past the lease
        elif s.kind is HostKind.DROP:
            assert 0.1 <= s.loss <= 0.3 and s.hold_s == 20.0
        elif s.kind is HostKind.LATENCY:
            assert 50 <= s.latency_ms[0] <= s.latency_ms[1] <= 200 and s.hold_s == 20.0
        elif s.kind is HostKind.SKEW:
            assert s.offset in {"+30s", "-30s"}
        else:
            assert s.target in {"tm1", "tm2", "tm3"}
    assert {s.target for s in plans if s.kind is HostKind.SKEW} == {"tm1", "tm2", "tm3", "jm1", "jm2"}
    assert {s.offset for s in plans if s.kind is HostKind.SKEW} == {"+30s", "-30s"}


def test_one_taskmanager_host_is_refused_saying_why() -> None:
    with pytest.raises(ValueError, match=r"1 TaskManager host\(s\): the campaign needs at least 2"):
        _plan(0, 1)
