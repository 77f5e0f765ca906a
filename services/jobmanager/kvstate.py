"""The JobManager's part in queryable state that touches Redis: disposing a job's state
(``DisposeJob`` on the cluster inbox) and retiring the state of attempts that ended.

The registry's decisions are pure (services/kvstate/core.py); this module carries them
out: the job's ``JobDisposed`` fact is committed to the job's tag, then the state hashes
are deleted, then the request is acknowledged with the reply in one cluster commit. A
crash in between re-delivers the request, and doing it again is harmless.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from sluice.events import DisposeJob, Envelope, Event, JobDisposed, NotifyKvStateUnregistered
from sluice.services.common.world import World
from sluice.services.jobs.core import Decision
from sluice.services.jobs.state import evolve
from sluice.services.kvstate.core import dispose
from sluice.store import Consumed
from sluice.store.consumer import Entry

from .committer import Committer
from .state import CurrentState

__all__ = ["JobDisposal", "retired_state"]


def retired_state(facts: Iterable[Event]) -> list[str]:
    """State ids that committed facts retired (unregistered attempts, a disposed job)."""
    return [s for f in facts if type(f) is NotifyKvStateUnregistered or type(f) is JobDisposed for s in f.state_ids]


class JobDisposal:
    """``DisposeJob`` carried out. Built from the leader's state (as it is now), the world,
    the committer, the consumer group, a logger, ``restore(job_id)`` (an archived job brought
    back from its snapshot: services/jobmanager/snapshot.py) and ``commit_job(decision)``
    (a job's decision committed with its coordinators: services/jobmanager/job_inboxes.py)."""

    def __init__(
        self,
        *,
        state: CurrentState,
        world: World,
        committer: Committer,
        group: str,
        logger: Any,
        restore: Callable[[str], bool],
        commit_job: Callable[[Decision], None],
    ) -> None:
        self.state, self.world, self.committer, self.group, self.logger = state, world, committer, group, logger
        self.restore, self.commit_job = restore, commit_job

    def handle(self, entry: Entry, msg: DisposeJob) -> None:
        env = entry.envelope
        self.restore(msg.job_id)  # an ended job left the leader's memory: brought back from its snapshot
        jobs = self.state().jobs
        facts, reply = dispose(jobs, msg)
        if facts:
            now = self.world.now_ms()
            self.commit_job(
                Decision(list(facts), job_id=msg.job_id, now=now)
            )  # deletes the state it names, once committed
            for fact in facts:
                evolve(self.state().jobs, Envelope(fact, "", 0, now))
            self.logger.info(
                "job disposed", job=msg.job_id, names=reply.names if isinstance(reply, JobDisposed) else None
            )
        else:
            self.logger.warning("dispose refused", job=msg.job_id, reason=getattr(reply, "reason", None))
        self.committer.commit(
            self.committer.keys.cluster,
            [],
            sends=[(msg.reply_to, reply)],
            consumed=Consumed(entry.stream, self.group, entry.id),
            cause=env.id,
        )
