"""The leader's side of the storage check before submission: the root's identity, told to
every TaskManager it acknowledges; the refusal of a job while a registered TaskManager
reports it cannot see the root; and the markers of the running jobs a new leader restores.

The identity is read (or made) the first time it is needed, a TaskManager registering or
a job submitted, and read again when it is needed and older than ``REFRESH_MS``: the
root's URI does not change while a JobManager runs, but what is mounted there may (a
JobManager started before the shared mount was up made a private identity the mount then
hid; someone removed ``_SLUICE_ROOT``), and an identity kept for ever would refuse every
submission until a restart. When it cannot be made, nothing is told (TaskManagers check
nothing before submission, the check before a job's first task stays) and it is tried
again a little later.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from sluice.errors import StorageUnreachable
from sluice.services.common import job_marker, root_identity
from sluice.services.common.shell import hostname
from sluice.services.common.world import World, monotonic_ms
from sluice.services.membership.core import Membership, MembershipConfig
from sluice.services.membership.storage import refusal

if TYPE_CHECKING:
    from sluice.services.jobs.state import JobRun

__all__ = ["StorageIdentity", "RETRY_MS"]

RETRY_MS = 10_000
"""After a failure to make or read the root's identity, how long before trying again."""
REFRESH_MS = 30_000
"""How old a known identity may be before it is read again (as TaskManagers look again)."""


class StorageIdentity:
    """Built from the root's URI, the membership config to tell it with, the leader's
    membership as it is now, the world (clock, ids) and a logger."""

    def __init__(
        self,
        storage_root: str,
        config: MembershipConfig,
        membership: Callable[[], Membership],
        world: World,
        logger: Any,
    ) -> None:
        self.storage_root, self.base, self.membership = storage_root, config, membership
        self.world, self.logger = world, logger
        self.root_id: str | None = None
        """The identity of the leader's storage root ("": the root has none; None: not known yet)."""
        self._retry_at = 0
        self._read_at = 0

    def known(self) -> str:
        """The root's identity, made or read now if not known yet or last read more than
        ``REFRESH_MS`` ago ("": none, or not now)."""
        now = monotonic_ms(self.world)
        if self.root_id is not None and now - self._read_at < REFRESH_MS:
            return self.root_id
        if now < self._retry_at:
            return self.root_id or ""
        try:
            found = root_identity.ensure(self.storage_root, self.world.new_id, hostname())
        except StorageUnreachable as exc:
            self._retry_at = now + RETRY_MS
            self.logger.warning(
                "the storage root has no identity: TaskManagers cannot check it before submission", error=str(exc)[:300]
            )
            return self.root_id or ""
        self._read_at = now
        if found != self.root_id:
            if self.root_id:  # what is mounted at the root changed: reports on the old identity no longer count
                self.logger.warning(
                    "the storage root's identity changed", storage_root=self.storage_root, was=self.root_id, now=found
                )
            elif found:
                self.logger.info("storage root identity", storage_root=self.storage_root, root_id=found)
            self.root_id = found
        return self.root_id

    def config(self) -> MembershipConfig:
        """The membership config, with the root and its identity to tell a TaskManager."""
        root_id = self.known()
        return replace(self.base, storage_root=self.storage_root, root_id=root_id) if root_id else self.base

    def refusal(self) -> str | None:
        """Why a job is refused now: a registered TaskManager reported it cannot see the root."""
        root_id = self.known()
        return refusal(self.membership(), self.storage_root, root_id) if root_id else None

    def mark_restored(self, job: JobRun) -> None:
        """Write the marker of a running job a new leader restored, if it has none: a job a
        leader of an older Sluice accepted has none, and a TaskManager of this one would fail
        it at its next task. Left as it is when there (the leader that accepted it wrote it)."""
        path = job_marker.marker_path(job.storage_root, job.job_id)
        try:
            if path is None or path.is_file():
                return
            job_marker.write(job.storage_root, job.job_id, job_marker.input_paths(job.splits), hostname())
        except (OSError, StorageUnreachable) as exc:  # its next task says what the TaskManager sees
            self.logger.warning("could not write the marker of a restored job", job=job.job_id, error=str(exc)[:300])
            return
        self.logger.info(
            "wrote the marker of a restored job (accepted by an older leader)", job=job.job_id, path=str(path)
        )
