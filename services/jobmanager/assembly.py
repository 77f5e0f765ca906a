"""The JobManager's collaborators, built and wired together.

Each is built from the few things it uses; what they ask of the shell as it is *now* (its
state, replaced whole at a take-over; its consumer; the jobs it is still rebuilding; its
snapshot writer) reaches them as :class:`Ports`, callables the shell answers. The shell
(services/jobmanager/process.py) keeps the phase and the steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sluice.events import LeadershipGranted
from sluice.services.jobs.core import JobsConfig
from sluice.services.membership.core import MembershipConfig
from sluice.store import Blobs, EventLog, GroupConsumer

from .cluster import ClusterInbox
from .committer import Committer
from .job_inboxes import JobInboxes
from .kvstate import JobDisposal
from .leadership import Rebuilt, Replay
from .recovery import Restorer
from .rejoin import Rejoin
from .retention import FactRetention, Retention
from .snapshot import Archive, SnapshotWriter
from .state import CurrentState

__all__ = ["Ports", "Collaborators", "Settings", "assemble"]


@dataclass(frozen=True)
class Ports:
    """What the collaborators ask the shell, as it is now."""

    state: CurrentState
    consumer: Callable[[], GroupConsumer]
    recovering: Callable[[], list[str]]
    """Live jobs still being rebuilt while the leader serves."""
    snapshots: Callable[[], SnapshotWriter | None]
    recover_pending: Callable[[str], None]
    """A job still being rebuilt, rebuilt at once (a message about it cannot wait)."""
    replay: Callable[[], Replay | None]
    """The rebuild going on, or None."""
    serve: Callable[[str], None]
    """What a previous leader read of a joining job's inbox, handled."""
    progress: Callable[[], None]
    """The stall watchdog's progress."""
    all_recovered: Callable[[float], None]
    """Every job rebuilt while serving is (after so many seconds since the lease was taken)."""


@dataclass(frozen=True)
class Settings:
    """The JobManager's settings its collaborators use."""

    config: MembershipConfig
    jobs_config: JobsConfig
    storage_root: str
    group: str
    batch: int
    checkpoint_interval_ms: int
    coordinator_executor: Callable[[str], Any] | None
    inbox_retention_ms: int
    fact_retention: FactRetention | None


@dataclass(frozen=True)
class Collaborators:
    job_inboxes: JobInboxes
    archive: Archive
    retention: Retention
    """Trims the streams the leader serves and purges jobs (``fact_retention``: how long
    archived jobs' facts are kept; None: $SLUICE_FACT_RETENTION, by default for ever)."""
    disposal: JobDisposal
    cluster: ClusterInbox
    restorer: Restorer
    rejoin: Rejoin
    snapshot_writer: Callable[[Rebuilt, LeadershipGranted | None], SnapshotWriter]
    """A new leader's snapshot writer, from what it rebuilt and the grant it committed."""


def assemble(
    log: EventLog,
    committer: Committer,
    world: Any,
    logger: Any,
    blobs: Blobs,
    *,
    registered: set[str],
    purged: set[str],
    settings: Settings,
    ports: Ports,
) -> Collaborators:
    """Every collaborator, each given what it uses (``registered`` and ``purged`` are the
    shell's sets, refilled in place at each take-over)."""
    s, state = settings, ports.state
    job_inboxes = JobInboxes(
        state=state,
        committer=committer,
        keys=log.keys,
        world=world,
        jobs_config=s.jobs_config,
        logger=logger,
        consumer=ports.consumer,
        group=s.group,
        batch=s.batch,
        recovering=ports.recovering,
        storage_root=s.storage_root,
        blobs=blobs,
        checkpoint_interval_ms=s.checkpoint_interval_ms,
        coordinator_executor=s.coordinator_executor,
    )
    archive = Archive(log, committer, state, registered, purged, logger, ports.recover_pending)
    retention = Retention(
        log=log,
        committer=committer,
        state=state,
        registered=registered,
        purged=purged,
        world=world,
        logger=logger,
        inboxes=job_inboxes,
        restore=archive.restore_job,
        snapshots=ports.snapshots,
        inbox_retention_ms=s.inbox_retention_ms,
        group=s.group,
        facts=s.fact_retention,
    )
    disposal = JobDisposal(
        state=state,
        world=world,
        committer=committer,
        group=s.group,
        logger=logger,
        restore=archive.restore_job,
        commit_job=job_inboxes.commit,
    )
    cluster = ClusterInbox(
        state=state,
        committer=committer,
        keys=log.keys,
        world=world,
        config=s.config,
        jobs_config=s.jobs_config,
        logger=logger,
        blobs=blobs,
        storage_root=s.storage_root,
        group=s.group,
        registered=registered,
        jobs=job_inboxes,
        recovering=ports.recovering,
        dispose=disposal.handle,
        purge=retention.on_request,
    )
    restorer = Restorer(state, job_inboxes, committer, s.jobs_config, cluster.root.mark_restored)
    rejoin = Rejoin(
        restorer=restorer,
        world=world,
        logger=logger,
        replay=ports.replay,
        snapshots=ports.snapshots,
        state=state,
        serve=ports.serve,
        progress=ports.progress,
        done=ports.all_recovered,
    )

    def snapshot_writer(rebuilt: Rebuilt, grant: LeadershipGranted | None) -> SnapshotWriter:
        return SnapshotWriter(
            log=log,
            committer=committer,
            state=state,
            registered=registered,
            purged=purged,
            world=world,
            logger=logger,
            release=retention.release,
            rebuilt=rebuilt,
            grant=grant,
        )

    return Collaborators(job_inboxes, archive, retention, disposal, cluster, restorer, rejoin, snapshot_writer)
