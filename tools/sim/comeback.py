"""The ``tm_back_same_session`` fault: a leader commits ``TaskManagerLost`` and dies before
failing the attempts there; the TaskManager, never told, registers again under the same
session with the next leader (issue 28, finding 3).

``Comebacks`` remembers the attempts each such loss ended and checks that none of them
holds a slot in a later leader's state once its job is rebuilt there: whichever leader
committed the loss, and whether the job was rebuilt before the leader served or while it
served, the attempts of a registration that a committed loss ended fail.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sluice.errors import RedisUnavailable, StaleEpoch, StoreRestarted
from sluice.events import TaskManagerLost
from sluice.services.jobs.state import HOLDS_SLOT

from .faults import Crash

__all__ = ["Comebacks"]

REASON = "(simulated) lost; its leader dies before failing its tasks"


@dataclass
class _Loss:
    epoch: int
    generation: int
    """The store's generation then: a restart of Redis since voids the check (the loss may be
    lost, and every unfinished attempt runs again anyway)."""
    attempts: set[tuple[str, str]] = field(default_factory=set)
    """(job id, execution id) placed on the lost registration."""


class Comebacks:
    def __init__(self) -> None:
        self.losses: list[_Loss] = []
        self.struck = 0
        """Losses committed that ended attempts (the scenario happened)."""

    def strike(self, sim: Any) -> None:
        """The leader commits a TaskManager's loss and dies before applying it."""
        now = sim.world.now
        proc = next((p for p in sim.jms if p.jm.leading and p.runnable(now)), None)
        if proc is None or not proc.jm.state.membership.active():
            return
        jm = proc.jm
        row = sim.rng.choice(jm.state.membership.active())
        placed = {
            (job_id, ex.id)
            for job_id, job in jm.state.jobs.jobs.items()
            for ex in job.executions()
            if ex.state in HOLDS_SLOT and ex.taskmanager == row.resource_id and ex.session in (None, row.session)
        }
        loss = _Loss(jm.committer.epoch or 0, sim.store.generation, placed)
        try:
            jm.cluster.commit_facts([TaskManagerLost(row.resource_id, row.session, REASON)], consequences=False)
        except (RedisUnavailable, StaleEpoch, StoreRestarted):
            # Refused, or its reply lost (it may have landed): the leader dies all the same, as
            # a step of its own that met this would have stepped down (its state is unknown).
            sim._crash(proc)
            return
        except Crash:  # it died in the commit: before it took effect, or after
            facts = sim.store.entries(sim.keys.facts(sim.keys.cluster))
            if not facts or REASON.encode() not in next(iter(facts[-1][1].values())):
                sim._crash(proc)
                return  # not committed: nothing to check
        self.losses.append(loss)
        self.struck += bool(placed)
        sim.note(f"{proc.name}: commits {row.resource_id} lost and dies before failing its {len(placed)} attempts")
        sim._crash(proc)

    def check(self, sim: Any) -> None:
        from .invariants import Violation

        self.losses = [loss for loss in self.losses if loss.generation == sim.store.generation and loss.attempts]
        if not self.losses:
            return
        leader = next((p.jm for p in sim.jms if p.jm.leading), None)
        if leader is None or leader.epoch is None:
            return
        recovering = set(leader.recovering)
        for loss in self.losses:
            if leader.epoch <= loss.epoch:
                continue
            for job_id, eid in loss.attempts:
                job = leader.state.jobs.jobs.get(job_id)
                if job is None or job_id in recovering:
                    continue
                ex = job.current(eid)
                if ex is not None and ex.state in HOLDS_SLOT:
                    raise Violation(
                        f"{eid} of {job_id} still holds a slot ({ex.state.value} on {ex.taskmanager}) in "
                        f"{leader.id}'s state at epoch {leader.epoch}, though a loss committed at epoch "
                        f"{loss.epoch} ended the registration it was placed on"
                    )
