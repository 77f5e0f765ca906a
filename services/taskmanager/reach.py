"""Whether this TaskManager sees a job's storage root and inputs: checked once per job, remembered.

Before the first task of a job starts here, the TaskManager reads the job's marker and
looks for its input files (``services/common/job_marker.py``). The answer is kept for the
job's later tasks: a job of a thousand tasks costs one look, not a thousand. What cannot
be seen fails the task's start as not retryable, and the leader fails the job at once.
"""

from __future__ import annotations

from collections import OrderedDict

from sluice.errors import StorageUnreachable
from sluice.events import TaskDeploymentDescriptor
from sluice.services.common.job_marker import unreachable

__all__ = ["Reach"]

_REMEMBERED = 1_000
"""Jobs whose answer is kept (the oldest go first: a job's tasks come close together)."""


class Reach:
    """The storage check of one TaskManager (``resource_id`` on ``host``), with its answers."""

    def __init__(self, resource_id: str, host: str) -> None:
        self.resource_id, self.host = resource_id, host
        self.answers: OrderedDict[tuple[str, str], StorageUnreachable | None] = OrderedDict()
        self.looks = 0
        """How many times the storage was looked at (not answered from memory)."""

    def check(self, d: TaskDeploymentDescriptor) -> None:
        """Raise StorageUnreachable when this TaskManager cannot run tasks of ``d``'s job
        here (a descriptor without a storage root, from an older leader: not checked)."""
        if not d.storage_root:
            return
        key = (d.job_id, d.storage_root)
        if key in self.answers:
            answer = self.answers[key]
        else:
            self.looks += 1
            answer = self.answers[key] = unreachable(d.storage_root, d.job_id, self.resource_id, self.host)
            while len(self.answers) > _REMEMBERED:
                self.answers.popitem(last=False)
        if answer is not None:
            raise answer
