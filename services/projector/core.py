"""Projections: how a fact stream becomes a table, using the components' own ``evolve``.

A projection names its table, the fact stream it reads, how to start (``initial``),
how to apply an event (the component's ``evolve``), which rows an event touches, how
to render a row, and how to rebuild the state from the stored rows (so a restarted
projector carries on from its table and position instead of replaying everything).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from sluice.events import Envelope, LeadershipGranted
from sluice.services.membership.core import Membership, TaskManagerRow, evolve as membership_evolve

__all__ = ["Projection", "PROJECTIONS", "TASKMANAGERS", "LEADERSHIP", "table_of"]


@dataclass(frozen=True)
class Projection:
    name: str
    initial: Callable[[], Any]
    evolve: Callable[[Any, Envelope], Any]
    touched: Callable[[Envelope], tuple[str, ...]]
    row: Callable[[Any, str], dict | None]
    load: Callable[[dict[str, dict]], Any]


def _tm_touched(env: Envelope) -> tuple[str, ...]:
    rid = getattr(env.event, "resource_id", None)
    return (rid,) if rid is not None else ()


def _tm_row(state: Membership, key: str) -> dict | None:
    row = state.taskmanagers.get(key)
    return row.to_dict() if row else None


def _tm_load(rows: dict[str, dict]) -> Membership:
    return Membership(taskmanagers={k: TaskManagerRow.from_dict(v) for k, v in rows.items()})


TASKMANAGERS = Projection(
    name="taskmanagers",
    initial=Membership,
    evolve=membership_evolve,
    touched=_tm_touched,
    row=_tm_row,
    load=_tm_load,
)


def _leader_evolve(state: Membership, env: Envelope) -> Membership:
    return membership_evolve(state, env) if isinstance(env.event, LeadershipGranted) else state


LEADERSHIP = Projection(
    name="leadership",
    initial=Membership,
    evolve=_leader_evolve,
    touched=lambda env: ("leader",) if isinstance(env.event, LeadershipGranted) else (),
    row=lambda state, key: {"epoch": state.epoch, "leader_id": state.leader_id} if state.leader_id else None,
    load=lambda rows: Membership(epoch=rows.get("leader", {}).get("epoch", 0), leader_id=rows.get("leader", {}).get("leader_id")),
)

PROJECTIONS: tuple[Projection, ...] = (TASKMANAGERS, LEADERSHIP)


def table_of(projection: Projection, state: Any, keys: set[str]) -> dict[str, dict | None]:
    return {k: projection.row(state, k) for k in keys}
