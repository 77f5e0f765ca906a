"""The chaos campaign across hosts (``scripts/chaos --hosts --runs N --seed S``, issue 29).

Each run brings up a ``tools.hosts.HostsCluster`` (SeaweedFS, Redis, two JobManagers, two
TaskManager hosts), runs the chaos workload's keyed three-stage job on it, and inflicts the
seed's one fault while the job's tasks run: a TaskManager host cut off past its heartbeat
timeout, the leading JobManager's host cut off past its lease, random packet loss or latency
on one host's link for 20 s, one host's clock 30 s off, or kill -9 of a TaskManager host.
Then it checks the output against plain Python, the read models against a replay of the
log, the fences (no fact below an epoch seen, no report of a lost TaskManager's attempt
taken after the loss, the deposed leader's and the lost TaskManager's refusal in their
logs), and that nothing is left on any host.

Modules: ``kinds`` (the faults and the seeded plan), ``strikes`` (doing each, timing
recovery), ``fences`` (the TaskManager side of fencing), ``run`` (one run), ``campaign``,
``report``. The workload, the job and the log checks are the single-host suite's.
"""

from .campaign import campaign
from .kinds import HostKind, HostStrike, plan
from .run import HostRunResult, run_once

__all__ = ["campaign", "run_once", "HostRunResult", "HostKind", "HostStrike", "plan"]
