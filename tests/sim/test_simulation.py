"""The deterministic simulation in the default test run: a slice of seeds under swarm
faults, a scenario per reproduced failover bug, and replay of a seed. The long runs are
``scripts/simulate`` and ``-m slow``."""

from __future__ import annotations

import multiprocessing
import os
import random
from collections.abc import Iterator

import pytest
import structlog

from tools.sim.cli import digest
from tools.sim.cluster import Outcome, run_seed
from tools.sim.faults import KINDS, Faults
from tools.sim.notes import quiet_logging

SLICE = 480
CHUNK = 60


@pytest.fixture(autouse=True, scope="module")
def _quiet() -> Iterator[None]:
    """The components' log lines go to the simulation's notes while this module runs, and
    back where they went after it (a test that reads them must not depend on the order)."""
    before = structlog.get_config()
    quiet_logging()
    yield
    structlog.configure(**before)


def failures(outcomes: list[Outcome]) -> str:
    bad = [o for o in outcomes if not o.ok]
    if not bad:
        return ""
    first = bad[0]
    return (
        f"{len(bad)} of {len(outcomes)} seeds failed: {[o.seed for o in bad]}; replay one with "
        f"scripts/simulate --seed {first.seed}\n\n{first.trace}"
    )


def _seed(seed: int) -> Outcome:
    quiet_logging()
    return run_seed(seed)


@pytest.fixture(scope="module")
def pool():
    """Processes for the slice, one per core (spawned: this process may hold Spark's threads)."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(min(os.cpu_count() or 1, 4)) as p:
        yield p


@pytest.mark.timeout(300)
@pytest.mark.parametrize("start", range(0, SLICE, CHUNK))
def test_a_slice_of_seeds_under_swarm_faults_is_clean(start: int, pool) -> None:
    """Every invariant after every step, every job ended once faults stopped."""
    outcomes = pool.map(_seed, range(start, start + CHUNK), chunksize=4)
    assert not failures(outcomes), failures(outcomes)


def _scenario_seed(args: tuple[int, tuple[str, ...], dict]) -> Outcome:
    seed, kinds, kwargs = args
    quiet_logging()
    return run_seed(seed, faults=Faults.swarm(random.Random(seed), kinds, all_on=True), **kwargs)


def scenario(kinds: tuple[str, ...], seeds: range, pool, **kwargs: object) -> list[Outcome]:
    """The seeds with these kinds of fault on in every one, on the module's processes."""
    return pool.map(_scenario_seed, [(seed, kinds, kwargs) for seed in seeds], chunksize=4)


# One scenario per failover bug the adversarial review reproduced (issue 9), each with the
# faults that made it happen switched on in every seed.
SCENARIOS = {
    "1 outbox split between two deliverers": ("redeliver", "interleave", "cancel", "pause"),
    "2 a new leader decides pending entries twice": ("crash", "crash_mid_call", "interleave"),
    "3 one bad reply_to stops every JobManager": ("hostile", "crash"),
    "4 a hostile registration forces a replay": ("hostile", "conn_loss"),
    "5 a TaskManager handles a SubmitTask twice": ("conn_loss", "heartbeat_loss"),
    "7 live TaskManagers declared lost after a stall": ("pause", "clock_jump", "interleave"),
    "8 a stale attempt overwrites its replacement's sink": ("pause", "crash", "heartbeat_loss", "user_error"),
    "lost writes and restarts of Redis": ("redis_lose", "redis_restart", "conn_loss", "crash"),
    "clocks skewed and stepped per host": ("clock_skew", "pause", "heartbeat_loss", "crash"),
    # Issue 28: one scenario per finding.
    "28.1 a deposed leader's read reorders an inbox": ("deposed_read", "pause", "interleave"),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_failover_scenarios_are_clean(name: str, pool) -> None:
    outcomes = scenario(SCENARIOS[name], range(1000, 1040), pool)
    assert not failures(outcomes), failures(outcomes)


@pytest.mark.timeout(300)
def test_a_replay_longer_than_the_stall_limit_still_ends_in_a_leader(pool) -> None:
    """Bug 6: every page of a new leader's replay is progress. Here a page is 3 facts and the
    stall limit 0.4 s: shorter than a whole replay of these logs (two jobs, a hundred facts
    and more, one page per step), longer than the wait between two steps of one process."""
    outcomes = scenario(("crash",), range(2000, 2030), pool, max_stall_s=0.4, jobs=2, replay_page=3)
    assert not failures(outcomes), failures(outcomes)


def test_a_seed_replays_identically() -> None:
    for seed in (7, 8):
        first, again = run_seed(seed), run_seed(seed)
        assert digest(first.__dict__) == digest(again.__dict__)
        assert (first.steps, first.facts, first.jobs) == (again.steps, again.facts, again.jobs)


def test_each_host_has_its_own_wall_clock_and_a_monotonic_clock_that_never_goes_back() -> None:
    from tools.sim.cluster import SimConfig, Simulation

    sim = Simulation(SimConfig(11, faults=Faults.swarm(random.Random(11), ("clock_skew",), all_on=True)))
    clocks = [sim.clock(h) for h in ("jm0", "tm0", "client")]
    assert sim.clock("tm0") is clocks[1]  # a TaskManager and its workers: one host
    offsets = {c.offset_ms for c in clocks}
    last = [c.monotonic() for c in clocks]
    for _ in range(400):
        sim._tick()
        now = [c.monotonic() for c in clocks]
        assert all(b >= a for a, b in zip(last, now))
        last = now
    stepped = {c.offset_ms for c in clocks}
    assert stepped != offsets or len(offsets) > 1
    assert Simulation(SimConfig(11, faults=Faults.none())).clock("jm0") is not clocks[0]


@pytest.mark.parametrize("seed", [3, 4])
def test_a_step_of_the_leaders_wall_clock_loses_no_taskmanager(seed: int) -> None:
    """The heartbeat monitor ran on the wall clock: a leader's clock stepped 5 s forward
    (an NTP correction) declared every live TaskManager lost ("no heartbeat for 5060 ms")
    and failed their tasks. Timeouts run on the monotonic clock."""
    from sluice.events import FIELD
    from tools.sim.cluster import SimConfig, Simulation

    sim = Simulation(SimConfig(seed, faults=Faults({"clock_skew": 0.0}), jobmanagers=2, taskmanagers=2))
    for clock in sim.clocks.values():
        clock.offset_ms = 0  # (rate 0: no step but this one)
    for _ in range(300):
        sim._tick()
    leader = next(p for p in sim.jms if p.jm.leading)
    facts = sim.keys.facts(sim.keys.cluster)
    before = sim.store.length(facts)
    sim.clocks[f"jm{leader.index}"].offset_ms += 5000
    for _ in range(100):
        sim._tick()
    lost = [f[FIELD][:160] for _, f in sim.store.entries(facts)[before:] if b"TaskManagerLost" in f[FIELD]]
    assert not lost


@pytest.mark.parametrize("seed", [0, 1])
def test_a_step_back_of_a_taskmanagers_wall_clock_keeps_its_heartbeats(seed: int) -> None:
    """A TaskManager timed its heartbeats on its wall clock: stepped 5 s back, it sent none
    for 5 s and was declared lost ("no heartbeat for 1038 ms"), its tasks failed."""
    from sluice.events import FIELD
    from tools.sim.cluster import SimConfig, Simulation

    sim = Simulation(SimConfig(seed, faults=Faults({"clock_skew": 0.0}), jobmanagers=2, taskmanagers=2))
    for clock in sim.clocks.values():
        clock.offset_ms = 0  # (rate 0: no step but this one)
    for _ in range(300):
        sim._tick()
    facts = sim.keys.facts(sim.keys.cluster)
    before = sim.store.length(facts)
    sim.clocks["tm0"].offset_ms -= 5000
    for _ in range(200):
        sim._tick()
    lost = [f[FIELD][:160] for _, f in sim.store.entries(facts)[before:] if b"TaskManagerLost" in f[FIELD]]
    assert not lost


def test_every_fault_kind_is_used() -> None:
    rng = random.Random(3)
    on = set()
    for _ in range(50):
        on |= set(Faults.swarm(rng).rates)
    assert on == set(KINDS)
    assert set(Faults.swarm(rng, all_on=True).rates) == set(KINDS)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_a_long_run_with_every_fault_on_is_clean() -> None:
    """``-m slow``: 3,000 seeds with every kind of fault on (scripts/simulate runs more)."""
    outcomes = [run_seed(seed, faults=Faults.swarm(random.Random(seed), all_on=True)) for seed in range(3000)]
    assert not failures(outcomes), failures(outcomes)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_every_planted_bug_is_caught_within_1000_seeds() -> None:
    """``-m slow``: the planted-bug campaign (tools/sim/plants.py), each plant in processes
    of its own; the command fails when a plant goes uncaught."""
    import subprocess
    import sys

    from tools import with_tools

    run = subprocess.run(
        [sys.executable, "-m", "tools.sim", "--campaign", "--seeds", "1000", "--all-faults", "--workers", "2"],
        env=with_tools(),
        capture_output=True,
        text=True,
        timeout=3500,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "NOT CAUGHT" not in run.stdout
