"""A deterministic simulation of a whole Sluice cluster in one process.

The real JobManagers, TaskManagers, projector, client and coordinators run over an
in-memory log (``store.memory``, which passes the same contract tests as Redis), on a
simulated clock, under a seeded scheduler that picks which actor takes its next step and
injects faults between any two calls to the log. Invariants are checked after every
step; a failing seed prints a readable trace and replays identically.

``run_seed(seed)`` runs one world; ``scripts/simulate`` runs many.
"""

from .cluster import Outcome, SimConfig, Simulation, run_seed

__all__ = ["Outcome", "SimConfig", "Simulation", "run_seed"]
