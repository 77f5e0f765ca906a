"""The JobManager's part in queryable state that touches Redis: disposing a job's state
(``DisposeJob`` on the cluster inbox) and retiring the state of attempts that ended.

The registry's decisions are pure (services/kvstate/core.py); this module carries them
out: the job's ``JobDisposed`` fact is committed to the job's tag, then the state hashes
are deleted, then the request is acknowledged with the reply in one cluster commit. A
crash in between re-delivers the request, and doing it again is harmless.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from sluice.events import DisposeJob, Envelope, Event, JobDisposed, NotifyKvStateUnregistered
from sluice.services.jobs.core import Decision
from sluice.services.jobs.state import evolve
from sluice.services.kvstate.core import dispose

from .leadership import restore_job

if TYPE_CHECKING:
    from sluice.store.consumer import Entry

    from .process import JobManager

__all__ = ["dispose_job", "retired_state"]


def retired_state(facts: Iterable[Event]) -> list[str]:
    """State ids that committed facts retired (unregistered attempts, a disposed job)."""
    return [s for f in facts if type(f) is NotifyKvStateUnregistered or type(f) is JobDisposed for s in f.state_ids]


def dispose_job(jm: JobManager, entry: Entry, msg: DisposeJob) -> None:
    env = entry.envelope
    restore_job(jm, msg.job_id)  # an ended job left the leader's memory: brought back from its snapshot
    facts, reply = dispose(jm.state.jobs, msg)
    if facts:
        now = jm.world.now_ms()
        jm.job_inboxes.commit(Decision(list(facts), job_id=msg.job_id, now=now))  # deletes its state, once committed
        for fact in facts:
            evolve(jm.state.jobs, Envelope(fact, "", 0, now))
        jm.logger.info("job disposed", job=msg.job_id, names=reply.names if isinstance(reply, JobDisposed) else None)
    else:
        jm.logger.warning("dispose refused", job=msg.job_id, reason=getattr(reply, "reason", None))
    jm.committer.commit(jm.tag, [], sends=[(msg.reply_to, reply)], consumed=jm.cluster.consumed(entry), cause=env.id)
