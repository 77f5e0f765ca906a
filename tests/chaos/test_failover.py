"""Chaos on a Redis Cluster (tools/chaos/failover.py): kill -9 the master holding a running
job's tag, then (another run) the one holding the cluster's tag, then one holding neither
(the job re-runs nothing); the replica is promoted and the job finishes with exact output.
The campaign of record is ``scripts/chaos --failover all --runs 10`` (docs/cluster-failover.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.chaos.failover import failover_campaign, summary

pytestmark = pytest.mark.chaos


@pytest.mark.timeout(900)
def test_a_failover_of_either_master_costs_time_never_data(tmp_path: Path) -> None:
    results = failover_campaign("all", 1, 0, tmp_path / "chaos", say=lambda *_: None)
    assert [r.kind for r in results] == ["job", "cluster", "other"]
    failed = {(r.kind, r.seed): r.failures for r in results if not r.ok}
    assert failed == {}, failed
    assert all(r.promoted_s is not None and r.recovered_s is not None for r in results), summary(results)
