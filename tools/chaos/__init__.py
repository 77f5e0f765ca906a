"""The chaos suite: real clusters under seeded faults (``scripts/chaos --runs N --seed S``).

Each run starts a cluster of real processes, keeps a three-stage keyed job running over
seeded Zipf text while strikes land (kill -9 of the leader, a TaskManager, a worker or
Redis; SIGSTOP of a TaskManager or the leader), and checks the output against plain
Python, the read models against a replay of the log, the fences, and that nothing leaked.

Modules: ``workload`` (input and expected result), ``job`` (the job file), ``kinds`` (what
strikes and the seeded plan), ``procs`` (/proc), ``cluster`` (the run's processes),
``strikes`` (doing each kind, timing recovery), ``jobs`` (submitting and checking jobs),
``checks`` (replay, fences), ``run`` (one run), ``campaign``, ``report``, ``cli``.
"""

from .campaign import campaign
from .kinds import Kind, Strike, plan
from .run import RunResult, run_once

__all__ = ["campaign", "run_once", "RunResult", "Kind", "Strike", "plan"]
