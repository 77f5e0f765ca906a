"""A small chaos campaign on real processes: two runs of three strikes cover all six kinds
(kill -9 of the leader, a TaskManager, a worker and Redis; SIGSTOP of a TaskManager and of
the leader), each run checking exact output, replay against the tables, fences and leaks."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from tools.chaos import campaign
from tools.chaos.kinds import KINDS

pytestmark = pytest.mark.chaos


@pytest.mark.timeout(1800)
def test_a_two_run_campaign_survives_every_kind_of_strike(tmp_path: Path) -> None:
    results = campaign(2, 0, 3, tmp_path / "chaos", console=Console(emoji=False, width=160))
    assert {o.kind for r in results for o in r.strikes} == set(KINDS)
    failed = {r.seed: r.failures for r in results if not r.ok}
    assert failed == {}, failed
