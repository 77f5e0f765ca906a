"""Whether a submission is refused because a registered TaskManager cannot see the storage
root, pure: a question asked of the membership table (the facts ``TaskManagerStorageReach``).

Only what a TaskManager reported counts. One that has not reported on the leader's root
(it has just registered, or runs an older Sluice) does not hold a submission back: the
check before its first task of a job (``services/taskmanager/reach.py``) covers it.
"""

from __future__ import annotations

from .core import Membership, TaskManagerRow

__all__ = ["blind", "refusal", "ADVICE"]

ADVICE = (
    "every TaskManager must reach the same storage root (a shared filesystem mounted at the same path on "
    "every host, see README 'Across hosts'): mount it there, or stop that TaskManager, then submit again"
)


def blind(state: Membership, storage_root: str, root_id: str) -> list[TaskManagerRow]:
    """The registered TaskManagers that reported they cannot see ``storage_root`` of identity
    ``root_id``, by resource id."""
    return sorted(
        (r for r in state.active() if r.sees_root(storage_root, root_id) is False), key=lambda r: r.resource_id
    )


def refusal(state: Membership, storage_root: str, root_id: str) -> str | None:
    """Why a job on ``storage_root`` is refused now, naming each TaskManager that cannot see
    it, its host and the path it looked at (None: none reported so)."""
    rows = blind(state, storage_root, root_id)
    if not rows:
        return None
    said = "; ".join(
        f"TaskManager {r.resource_id} on host {r.host} cannot see the storage root {storage_root} "
        f"({r.storage_path}: {r.storage_problem})"
        for r in rows
    )
    return f"{said}: {ADVICE}"
