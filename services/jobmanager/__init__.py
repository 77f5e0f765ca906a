"""The JobManager: leader election, the cluster inbox, membership, the jobs' inboxes."""

from .process import JobManager
from .state import Phase

__all__ = ["JobManager", "Phase"]
