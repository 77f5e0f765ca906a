"""The JobManager: leader election, the cluster inbox, membership, the jobs' inboxes.

``process`` is the shell (``JobManager``): it owns the phase and the steps. Its duties are
split into small modules, each collaborator built from the few things it uses (the leader's
state, the committer, the keys, the world, a logger, small ports), none of them seeing the
JobManager; ``assembly`` builds and wires them:

* ``leadership``: the lease, the stall watchdog, and the page-by-page rebuild from the log;
  ``runner``: the process's loop and its lease-renewal thread;
* ``batches``: a batch read from every inbox through one consumer group, and routed;
* ``cluster``: the cluster inbox (TaskManagers joining, beating, leaving; jobs submitted);
* ``job_inboxes``: each job's inbox, its coordinators and the scheduling of its tasks;
* ``committer``: the only part that writes (fenced commits, delivery, dead letters);
* ``snapshot``, ``snapshot_codec``: the leader's snapshots, and the jobs they archive;
* ``recovery``: the rebuilt jobs restored into a new leader's state; ``rejoin``: jobs
  rebuilt while it already serves; ``restarts``: a restart of Redis noticed and announced;
* ``retention``, ``kvstate``, ``unreadable``, ``storage_identity``: trimming and purging,
  disposing a job's queryable state, a log this JobManager cannot read, and the storage
  root's identity;
* ``state``: the leader's state and its ``Phase``.
"""

from .process import JobManager
from .state import Phase

__all__ = ["JobManager", "Phase"]
