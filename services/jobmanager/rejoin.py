"""Jobs rebuilt while the leader already serves (``SERVE_AFTER_S``): a page of their rebuild
a step, each joining as a new leader's jobs do once its last page is folded
(``Restorer.join``), and one rebuilt at once when a message about it cannot wait."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sluice.services.common.world import World

from .leadership import Replay
from .recovery import Restorer
from .snapshot import SnapshotWriter
from .state import CurrentState

__all__ = ["Rejoin"]


class Rejoin:
    """Built from the restorer, the world, a logger, the shell's answers as they are now
    (``replay()``: the rebuild going on, or None; ``snapshots()``: its snapshot writer;
    ``state()``), ``serve(job_id)`` (what a previous leader read of a joining job's inbox,
    handled), ``progress()`` (the stall watchdog's), and ``done(seconds)``: every job is
    rebuilt (the shell drops the replay and schedules)."""

    def __init__(
        self,
        *,
        restorer: Restorer,
        world: World,
        logger: Any,
        replay: Callable[[], Replay | None],
        snapshots: Callable[[], SnapshotWriter | None],
        state: CurrentState,
        serve: Callable[[str], None],
        progress: Callable[[], None],
        done: Callable[[float], None],
    ) -> None:
        self.restorer, self.world, self.logger = restorer, world, logger
        self.replay, self.snapshots, self.state, self.serve = replay, snapshots, state, serve
        self.progress, self.done = progress, done
        self.took_lease = 0.0
        """When this leader took the lease (the world's monotonic clock, in seconds)."""

    def step(self) -> None:
        """A page of the rebuild of the jobs left when this leader began to serve."""
        replay = self.replay()
        assert replay is not None
        replay.step()
        self.join_rebuilt(replay)

    def now(self, job_id: str) -> None:
        """Rebuild a job still being recovered at once (a message about it cannot wait)."""
        replay = self.replay()
        assert replay is not None
        replay.rebuild_now(job_id, progress=self.progress)  # each page is progress
        self.join_rebuilt(replay)

    def join_rebuilt(self, replay: Replay) -> None:
        """Jobs whose rebuild ended: restored and served as a new leader's jobs are."""
        r = replay.result
        now = self.world.now_ms()
        for job_id in replay.take_rebuilt():
            job = self.restorer.join(job_id, r, now, snapshots=self.snapshots(), serve=self.serve)
            self.logger.info(
                "job recovered",
                job=job_id,
                status=job.status.value if job is not None else None,
                left=len(replay.pending),
            )
        if replay.done:
            seconds = self.world.monotonic() - self.took_lease
            self.logger.info(
                "every job recovered",
                epoch=self.state().jobs.epoch,
                replayed=r.facts,
                jobs=len(self.state().jobs.jobs),
                seconds=round(seconds, 3),
            )
            self.done(seconds)
