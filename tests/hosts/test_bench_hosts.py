"""``scripts/bench hosts`` end to end on a small text (slow: it brings three clusters of hosts up,
one of them on a Spark standalone cluster): every row measured, every output checked word by
word against the plain-Python count inside the bench (it raises otherwise)."""

from __future__ import annotations

import pytest

from tools.bench.hosts import ratios, run

pytestmark = [pytest.mark.hosts, pytest.mark.slow, pytest.mark.timeout(1800)]


def test_bench_hosts_measures_every_row_on_exact_outputs(hosts_available: None) -> None:
    rows = run(megabytes=2, rounds=1, modes=("local", "standalone"))
    assert [r.name for r in rows] == [
        "plain PySpark, 1 host",
        "Sluice, 1 host",
        "Sluice, 2 hosts, local",
        "Sluice, 2 hosts, standalone",
    ]
    for r in rows[1:]:
        assert sorted(r.phases) == ["lines -> count words", "sum counts -> out"], r.phases
        assert "tm1" in r.placement
    assert "tm2" in rows[2].placement and "tm2" in rows[3].placement
    assert set(ratios(rows)["Sluice, 2 hosts, local"]) == {"plain", "one host"}
