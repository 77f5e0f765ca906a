"""The JobManager: leader election, the cluster inbox, membership (later: jobs)."""

from .process import JobManager

__all__ = ["JobManager"]
