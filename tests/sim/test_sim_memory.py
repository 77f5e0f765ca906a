"""A seed leaves nothing behind: what it built is freed once it ends, without anyone
calling the collector (a pytest process running thousands of seeds grew past 13 GB)."""

from __future__ import annotations

import gc
import random

from tools.sim.cluster import Simulation, run_seed
from tools.sim.faults import Faults
from tools.sim.notes import quiet_logging


def test_the_garbage_of_past_seeds_is_collected_as_seeds_run() -> None:
    """The JobManagers' replays froze the heap (``gc.freeze``) at every page; a freeze
    resets the collector's count, so in a process of many replays it never ran, and every
    seed's world (cycles of actors, logs, states) stayed."""
    quiet_logging()
    gc.collect()
    for seed in range(24):
        run_seed(seed, faults=Faults.swarm(random.Random(seed), all_on=True))
    alive = sum(1 for o in gc.get_objects() if type(o) is Simulation)  # (no collection: what the process holds)
    assert gc.get_freeze_count() == 0
    assert alive <= 12, f"{alive} of 24 finished worlds are still in memory"
