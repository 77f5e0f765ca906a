"""Whether this TaskManager sees a job's storage root and inputs: checked once per job, remembered.

Before the first task of a job starts here, the TaskManager reads the job's marker and
looks for its input files (``services/common/job_marker.py``). The answer is kept for the
job's later tasks: a job of a thousand tasks costs one look, not a thousand. What cannot
be seen fails the task's start as not retryable, and the leader fails the job at once.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from sluice.errors import StorageUnreachable
from sluice.events import TaskDeploymentDescriptor
from sluice.services.common.job_marker import unreachable

__all__ = ["Reach"]

_REMEMBERED = 1_000
"""Jobs whose answer is kept (the oldest go first: a job's tasks come close together)."""

SETTLE_S = (0.1, 0.3, 0.6, 1.0)
"""Pauses before looking again when something is missing: a shared filesystem may show a
file another host has just written a moment late (NFS attribute caches, a FUSE mount's
metadata feed). 2 s in all, well inside a heartbeat timeout (the main loop waits)."""


class Reach:
    """The storage check of one TaskManager (``resource_id`` on ``host``), with its answers."""

    def __init__(
        self,
        resource_id: str,
        host: str,
        settle_s: Sequence[float] = SETTLE_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.resource_id, self.host = resource_id, host
        self.settle_s, self.sleep = tuple(settle_s), sleep
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
            answer = self._look(d)
            self.answers[key] = answer
            while len(self.answers) > _REMEMBERED:
                self.answers.popitem(last=False)
        if answer is not None:
            raise answer

    def _look(self, d: TaskDeploymentDescriptor) -> StorageUnreachable | None:
        """Look; when something is missing, look again after each pause (``settle_s``)."""
        for pause in (*self.settle_s, None):
            self.looks += 1
            answer = unreachable(d.storage_root, d.job_id, self.resource_id, self.host)
            if answer is None or pause is None:
                return answer
            self.sleep(pause)
        return None  # (not reached: the last pause is None)
