"""The leader's deadlines on its monotonic clock, on the session's real redis-server: the real
JobManager and TaskManager shells, stepped, with the leader's wall clock stepped 10 s
forward or back (an NTP correction) while a deadline runs.

Each deadline counted from a stamp of the log (``env.ts``: a wall clock) to the leader's
wall clock: stepped forward, it failed a slot wait or a deployment 10 s early and started
a restart before its delay; stepped back, it put each off by 10 s. Every test here failed
so. Only the leader's wall clock steps; the TaskManager's clock and every monotonic clock
run on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sluice.events import JobStatus, RestartStrategy, SubmitTask, TaskState
from sluice.services.jobmanager import JobManager
from sluice.services.jobs.core import JobsConfig
from sluice.services.membership import MembershipConfig
from sluice.services.taskmanager.core import RegistrationConfig
from sluice.services.taskmanager.process import TaskManager
from sluice.store import EventLog
from tests.services.failover_helpers import (
    ManualWorld,
    TinySlots,
    events,
    job_state,
    lead,
    pump,
    register_tm,
    report,
    source_graph,
    submit,
)

STEP_MS = 10_000
"""How far the leader's wall clock steps."""
DEADLINE_MS = 15_000
"""Every deadline under test: longer than the step, so a step forward alone cannot reach it."""
ADVANCE_MS = 100
"""How far every clock moves between rounds."""


class LeaderClock:
    """The leader's clocks: the test's, with a wall clock that steps (``offset_ms``); its
    monotonic clock is the test's, never stepped."""

    def __init__(self, world: ManualWorld) -> None:
        self.world, self.offset_ms = world, 0

    def now_ms(self) -> int:
        return self.world.now_ms() + self.offset_ms

    def monotonic(self) -> float:
        return self.world.monotonic()

    def new_id(self) -> str:
        return self.world.new_id()


class Cluster:
    """A leader on a stepping wall clock and one TaskManager (``slots`` slots) on the test's."""

    def __init__(
        self, log: EventLog, tmp_path: Path, *, slots: int = 1, lease_ttl_ms: int = 600_000, **jobs_config: Any
    ) -> None:
        self.log, self.world, self.tmp_path = log, ManualWorld(), tmp_path
        self.lease_ttl_ms, self.jobs_config = lease_ttl_ms, JobsConfig(**jobs_config)
        self.clock = LeaderClock(self.world)
        self.jm = self.jobmanager("jm-a", self.clock)
        lead(self.jm, self.world)
        self.slots = TinySlots(log)
        self.tm = TaskManager(
            log,
            resource_id="tm-1",
            slots=slots,
            host="host-a",
            world=self.world,
            runner=self.slots,
            home=tmp_path / "tm-1",
            config=RegistrationConfig(50, 400, 100, 600_000),
        )
        register_tm(self.jm, self.tm, self.world)
        self.elapsed_ms = 0
        """How far the test's clocks moved since ``mark``."""

    def jobmanager(self, name: str, clock: LeaderClock) -> JobManager:
        return JobManager(
            self.log,
            world=clock,
            jm_id=name,
            storage_root=f"file://{self.tmp_path}/storage",
            checkpoint_interval_ms=600_000,
            lease_ttl_ms=self.lease_ttl_ms,
            config=MembershipConfig(heartbeat_interval_ms=100, heartbeat_timeout_ms=1_000),
            jobs_config=self.jobs_config,
        )

    def run(self, until: Any, what: str, rounds: int = 400) -> None:
        def count() -> None:
            self.elapsed_ms += ADVANCE_MS

        pump(
            [lambda: self.tm.step(block_ms=None), lambda: self.jm.step(block_ms=None), self.jm.step_lease, count],
            until,
            what=what,
            world=self.world,
            advance_ms=ADVANCE_MS,
            rounds=rounds,
        )

    def for_ms(self, ms: int) -> None:
        """Run the cluster while every clock moves ``ms`` (nothing asked of it)."""
        end = self.elapsed_ms + ms
        self.run(lambda: self.elapsed_ms >= end, f"{ms} ms", rounds=ms // ADVANCE_MS + 2)

    def mark(self) -> None:
        self.elapsed_ms = 0

    def status(self, job_id: str) -> JobStatus:
        return job_state(self.log, job_id).status

    def attempts(self) -> list[int]:
        return [d["attempt"] for _, d, _ in self.slots.launched]


# --- waiting for slots -------------------------------------------------------------------------


def _waiting(c: Cluster) -> None:
    """j1 needs two slots of a TaskManager with one: its second subtask waits for a slot."""
    submit(c.log, c.world, "j1", source_graph("j1", parallelism=2))
    c.run(
        lambda: "j1" in c.jm.state.jobs.jobs and job_state(c.log, "j1").waiting_since is not None, "the wait for slots"
    )
    c.mark()


@pytest.mark.timeout(120)
def test_a_step_forward_of_the_leaders_wall_clock_does_not_end_a_wait_for_slots_early(
    log: EventLog, tmp_path: Path
) -> None:
    c = Cluster(log, tmp_path, slot_timeout_ms=DEADLINE_MS)
    _waiting(c)
    c.for_ms(DEADLINE_MS - STEP_MS + 2_000)
    c.clock.offset_ms += STEP_MS  # the log's stamp of the wait is now more than the timeout behind this clock
    c.for_ms(2_000)
    assert c.status("j1") == JobStatus.CREATED, job_state(log, "j1").reason
    c.run(lambda: c.status("j1") == JobStatus.FAILED, "the slot timeout", rounds=DEADLINE_MS // ADVANCE_MS)
    assert c.elapsed_ms >= DEADLINE_MS - 1_000  # (not 10 s early)
    assert "for free slots" in (job_state(log, "j1").reason or "")


@pytest.mark.timeout(120)
def test_a_step_back_of_the_leaders_wall_clock_does_not_put_a_wait_for_slots_off(log: EventLog, tmp_path: Path) -> None:
    c = Cluster(log, tmp_path, slot_timeout_ms=DEADLINE_MS)
    _waiting(c)
    c.clock.offset_ms -= STEP_MS
    c.run(
        lambda: c.status("j1") == JobStatus.FAILED,
        "the slot timeout",
        rounds=(DEADLINE_MS + STEP_MS // 2) // ADVANCE_MS,
    )
    assert c.elapsed_ms <= DEADLINE_MS + 1_000


# --- restart delays ----------------------------------------------------------------------------


def _failed_once(c: Cluster) -> None:
    """j1's only subtask fails; its restart strategy waits DEADLINE_MS before the next attempt."""
    graph = source_graph("j1")
    graph = type(graph)(
        graph.name,
        graph.vertices,
        graph.edges,
        graph.max_parallelism,
        RestartStrategy("fixed-delay", 3, DEADLINE_MS, DEADLINE_MS),
    )
    submit(c.log, c.world, "j1", graph)
    c.run(lambda: bool(c.slots.launched), "the deployment")
    c.for_ms(3_000)  # (so a delay counted from the leader's start, not the restart's, is 3 s early)
    report(c.log, c.world, c.slots.launched[0][1], "tm-1", 0, TaskState.FAILED)
    c.run(lambda: c.jm.state.jobs.jobs["j1"].restarts == 1, "the restart scheduled")
    c.mark()


@pytest.mark.timeout(120)
def test_a_step_forward_of_the_leaders_wall_clock_does_not_start_a_restart_before_its_delay(
    log: EventLog, tmp_path: Path
) -> None:
    c = Cluster(log, tmp_path)
    _failed_once(c)
    c.for_ms(DEADLINE_MS - STEP_MS + 2_000)
    c.clock.offset_ms += STEP_MS  # past the restart's not_before on this clock
    c.for_ms(2_000)
    assert c.attempts() == [0]
    c.run(lambda: c.attempts() == [0, 1], "the next attempt", rounds=DEADLINE_MS // ADVANCE_MS)
    assert c.elapsed_ms >= DEADLINE_MS - 2 * ADVANCE_MS  # (not 10 s early, nor from the leader's start)


@pytest.mark.timeout(120)
def test_a_step_back_of_the_leaders_wall_clock_does_not_put_a_restart_off(log: EventLog, tmp_path: Path) -> None:
    c = Cluster(log, tmp_path)
    _failed_once(c)
    c.clock.offset_ms -= STEP_MS
    c.run(lambda: c.attempts() == [0, 1], "the next attempt", rounds=(DEADLINE_MS + STEP_MS // 2) // ADVANCE_MS)
    assert c.elapsed_ms <= DEADLINE_MS + 1_000


@pytest.mark.timeout(120)
def test_a_new_leader_whose_wall_clock_is_ahead_waits_a_pending_restarts_delay_from_its_takeover(
    log: EventLog, tmp_path: Path
) -> None:
    """The leader that scheduled the restart dies; the next one's wall clock is 10 s ahead of
    its. It counts the delay from its takeover, on its own clock: later than it began, never
    earlier. On the wall clock, the log's ``not_before`` started the next attempt 10 s early."""
    c = Cluster(log, tmp_path, lease_ttl_ms=1_000)
    _failed_once(c)
    c.for_ms(2_000)
    ahead = LeaderClock(c.world)
    ahead.offset_ms = STEP_MS
    c.jm = c.jobmanager("jm-b", ahead)  # jm-a is no longer stepped: it died, its lease lapses
    assert lead(c.jm, c.world) == 2
    c.mark()
    c.run(lambda: c.attempts() == [0, 1], "the next attempt", rounds=(DEADLINE_MS + STEP_MS) // ADVANCE_MS)
    assert c.elapsed_ms >= DEADLINE_MS - 1_000  # (not 10 s early)


# --- deployment timeouts -----------------------------------------------------------------------


def _submit_task_lost(c: Cluster) -> None:
    """j1's SubmitTask is lost on the way (Redis lost it): the TaskManager's reports go on
    not listing the attempt, and the deployment times out."""
    inbox = c.log.keys.inbox(c.log.keys.taskmanager("tm-1"))
    submit(c.log, c.world, "j1", source_graph("j1"))
    c.run(lambda: bool(events(c.log, inbox, SubmitTask)), "the SubmitTask")
    c.mark()
    (lost,) = [i for i, env in c.log.replay(inbox) if isinstance(env.event, SubmitTask)]
    c.log.backend.client.xdel(inbox, lost)  # type: ignore[attr-defined]


def _timed_out(c: Cluster) -> bool:
    return any("DEPLOYING->FAILED" in what for _, what in job_state(c.log, "j1").vertices["src"].subtasks[0].history)


@pytest.mark.timeout(120)
def test_a_step_forward_of_the_leaders_wall_clock_does_not_time_a_deployment_out_early(
    log: EventLog, tmp_path: Path
) -> None:
    c = Cluster(log, tmp_path, deploy_timeout_ms=DEADLINE_MS)
    _submit_task_lost(c)
    c.for_ms(DEADLINE_MS - STEP_MS + 2_000)  # reports not listing it, for longer than the grace period
    c.clock.offset_ms += STEP_MS
    c.for_ms(2_000)
    assert not _timed_out(c)
    c.run(lambda: _timed_out(c), "the deployment timeout", rounds=DEADLINE_MS // ADVANCE_MS)
    assert c.elapsed_ms >= DEADLINE_MS - 1_000  # (not 10 s early)


@pytest.mark.timeout(120)
def test_a_step_back_of_the_leaders_wall_clock_does_not_put_a_deployment_timeout_off(
    log: EventLog, tmp_path: Path
) -> None:
    c = Cluster(log, tmp_path, deploy_timeout_ms=DEADLINE_MS)
    _submit_task_lost(c)
    c.clock.offset_ms -= STEP_MS
    c.run(lambda: _timed_out(c), "the deployment timeout", rounds=(DEADLINE_MS + STEP_MS // 2) // ADVANCE_MS)
    assert c.elapsed_ms <= DEADLINE_MS + 2_000  # (checked once a second)
