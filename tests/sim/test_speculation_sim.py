"""The simulation's speculation scenario (``scripts/simulate --speculation``): speculative
execution on in the JobManagers, one TaskManager 5x slower, and the invariants of
tools/sim/invariants.py (a speculative attempt runs on another TaskManager, a race has one
winner, only the winner's partition is announced, each split reaches the sink once, the
log folded from scratch or from a snapshot gives the leader's state)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog

from tools.sim.cluster import run_seed
from tools.sim.faults import Faults
from tools.sim.notes import quiet_logging


@pytest.fixture(autouse=True, scope="module")
def _quiet() -> Iterator[None]:
    before = structlog.get_config()
    quiet_logging()
    yield
    structlog.configure(**before)


@pytest.mark.parametrize("seed", [7, 15, 41])
def test_a_slow_subtask_races_a_speculative_attempt_and_the_job_is_exact(seed: int) -> None:
    outcome = run_seed(seed, faults=Faults.none(), speculation=True)
    assert outcome.ok, outcome.violation
    assert outcome.speculated >= 1 and outcome.raced >= 1, "the scenario no longer speculates: pick other seeds"
    assert set(outcome.jobs.values()) == {"FINISHED"}


def _all_faults(seeds: range) -> None:
    import random

    bad = []
    for seed in seeds:
        outcome = run_seed(seed, faults=Faults.swarm(random.Random(seed), all_on=True), speculation=True)
        if not outcome.ok:
            bad.append(f"seed {seed}: {outcome.violation and outcome.violation.splitlines()[0]}")
    assert not bad, f"replay with scripts/simulate --seed N --all-faults --speculation: {bad}"


def test_speculation_under_every_fault() -> None:
    _all_faults(range(0, 6))


@pytest.mark.slow
def test_speculation_under_every_fault_many_seeds() -> None:
    _all_faults(range(6, 206))
