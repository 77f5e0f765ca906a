"""Reconciliation on the session's real redis-server: the real JobManager and TaskManager
shells, stepped, with writes lost on the way as a Redis that loses its last second loses
them (a store fault hook, or the entry deleted before anyone read it).

Each case is one the leader could not recover from before slot reports: a worker's final
report lost, a SubmitTask lost, an attempt its TaskManager dropped without a word, a task
the leader does not know, a CancelTask lost.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sluice.events import (
    CancelJob,
    CancelTask,
    Envelope,
    JobStatus,
    SubmitJob,
    SubmitTask,
    TaskState,
    UpdateTaskExecutionState,
    decode_fields,
)
from sluice.services.common import job_marker
from sluice.services.jobmanager import JobManager
from sluice.services.jobmanager.cluster import plan_splits
from sluice.services.jobs import core
from sluice.services.jobs.core import JobsConfig
from sluice.services.jobs.state import JobsState
from sluice.services.membership import MembershipConfig
from sluice.services.taskmanager.core import RegistrationConfig
from sluice.services.taskmanager.process import TaskManager
from sluice.store import Blobs, EventLog
from sluice.store.backend import Delegating
from tests.services.failover_helpers import (
    CODE,
    ManualWorld,
    TinySlots,
    events,
    job_state,
    keyed_graph,
    lead,
    produced,
    pump,
    register_tm,
    report,
    source_graph,
    submit,
)

TIMEOUT_MS = 1_000  # the heartbeat timeout: also the grace period of reconciliation


def jm(log: EventLog, world: ManualWorld, tmp_path: Path, **kw: Any) -> JobManager:
    return JobManager(
        log,
        world=world,
        jm_id="jm-a",
        storage_root=f"file://{tmp_path}/storage",
        checkpoint_interval_ms=600_000,
        lease_ttl_ms=600_000,
        config=MembershipConfig(heartbeat_interval_ms=100, heartbeat_timeout_ms=TIMEOUT_MS),
        **kw,
    )


def tm(log: EventLog, world: ManualWorld, tmp_path: Path, slots: TinySlots) -> TaskManager:
    if slots.log is None:
        slots.log = log
    return TaskManager(
        log,
        resource_id="tm-1",
        slots=1,
        host="host-a",
        world=world,
        runner=slots,
        home=tmp_path / "tm-1",
        config=RegistrationConfig(50, 400, 100, 600_000),
    )


class LosesWrites(Delegating):
    """A store whose appends to ``stream`` that ``lose(fields)`` picks are acknowledged but
    never written (what an ``appendfsync everysec`` Redis that crashed did to them)."""

    def __init__(self, inner: Any, stream: str, lose: Any) -> None:
        super().__init__(inner)
        self.stream, self.lose, self.lost = stream, lose, 0

    def xadd(self, stream: str, fields: Mapping[bytes, bytes], *, maxlen: int | None = None) -> str:
        if stream == self.stream and self.lose(fields):
            self.lost += 1
            return "1-1"
        return super().xadd(stream, fields, maxlen=maxlen)

    def xadd_many(self, items: Sequence[tuple[str, Mapping[bytes, bytes]]]) -> list[str]:
        lost = [stream == self.stream and bool(self.lose(fields)) for stream, fields in items]
        self.lost += sum(lost)
        written = iter(super().xadd_many([item for item, gone in zip(items, lost) if not gone]))
        return ["1-1" if gone else next(written) for gone in lost]


class RecordsAppends(Delegating):
    """A store that remembers every entry appended to ``stream`` (an inbox an archived job's
    leader deletes: the test looks at what was sent to it afterwards)."""

    def __init__(self, inner: Any, stream: str) -> None:
        super().__init__(inner)
        self.stream, self.appended = stream, []

    def xadd(self, stream: str, fields: Mapping[bytes, bytes], *, maxlen: int | None = None) -> str:
        if stream == self.stream:
            self.appended.append(fields)
        return super().xadd(stream, fields, maxlen=maxlen)

    def xadd_many(self, items: Sequence[tuple[str, Mapping[bytes, bytes]]]) -> list[str]:
        self.appended += [fields for stream, fields in items if stream == self.stream]
        return super().xadd_many(items)


def setup(log: EventLog, tmp_path: Path, **jm_kw: Any) -> tuple[ManualWorld, JobManager, TaskManager, TinySlots]:
    world = ManualWorld()
    a = jm(log, world, tmp_path, **jm_kw)
    lead(a, world)
    slots = TinySlots()
    t = tm(log, world, tmp_path, slots)
    register_tm(a, t, world)
    return world, a, t, slots


def run(world: ManualWorld, a: JobManager, t: TaskManager, until: Any, what: str, rounds: int = 400) -> None:
    pump(
        [lambda: t.step(block_ms=None), lambda: a.step(block_ms=None), a.step_lease],
        until,
        what=what,
        world=world,
        advance_ms=50,
        rounds=rounds,
    )


def job_inbox(log: EventLog, job_id: str) -> str:
    return log.keys.inbox(log.keys.job(job_id))


def finished(log: EventLog, job_id: str) -> bool:
    return job_state(log, job_id).status == JobStatus.FINISHED


def launched(slots: TinySlots, attempt: int) -> dict:
    """Wait-free: the descriptor of the given attempt handed to a worker."""
    (d,) = [d for _, d, _ in slots.launched if d["attempt"] == attempt]
    return d


def test_a_final_report_lost_on_the_way_is_taken_from_the_slot_report(log: EventLog, tmp_path: Path) -> None:
    world, a, t, slots = setup(log, tmp_path)
    submit(log, world, "j1", source_graph("j1"))
    run(world, a, t, lambda: bool(slots.launched), "the deployment")
    d = launched(slots, 0)
    report(log, world, d, "tm-1", 0, TaskState.RUNNING)
    job_inbox = log.keys.inbox(log.keys.job("j1"))
    losing = LosesWrites(log.backend, job_inbox, lambda f: b"FINISHED" in next(iter(f.values())))
    report(EventLog(losing, log.keys), world, d, "tm-1", 0, TaskState.FINISHED)
    assert losing.lost == 1  # the job never hears it; the TaskManager's copy arrived
    run(world, a, t, lambda: finished(log, "j1"), "the job finishing")
    job = job_state(log, "j1")
    assert (job.status, job.restarts, job.vertices["src"].subtasks[0].attempt) == (JobStatus.FINISHED, 0, 0)
    # The leader confirmed it: the TaskManager no longer lists the final state.
    run(world, a, t, lambda: not t.finals, "the confirmation")


def test_a_submit_task_lost_on_the_way_times_out_and_the_task_runs_again(log: EventLog, tmp_path: Path) -> None:
    sent = RecordsAppends(log.backend, job_inbox(log, "j1"))  # the inbox goes when the job is archived
    log = EventLog(sent, log.keys)
    world, a, t, slots = setup(log, tmp_path, jobs_config=JobsConfig(deploy_timeout_ms=3_000))
    inbox = log.keys.inbox(log.keys.taskmanager("tm-1"))
    submit(log, world, "j1", source_graph("j1"))
    pump(
        [lambda: a.step(block_ms=None)],
        lambda: bool(events(log, inbox, SubmitTask)),
        what="the SubmitTask",
        world=world,
        advance_ms=10,
    )
    (lost,) = [i for i, env in log.replay(inbox) if isinstance(env.event, SubmitTask)]
    sent.inner.client.xdel(inbox, lost)  # type: ignore[attr-defined]  # Redis crashed before it reached the disk
    run(world, a, t, lambda: bool(slots.launched), "the deployment of the next attempt")
    assert [d["attempt"] for _, d, _ in slots.launched] == [1]
    facts = job_state(log, "j1").vertices["src"].subtasks[0].history
    assert any("DEPLOYING->FAILED" in what for _, what in facts)
    d = launched(slots, 1)
    for state in (TaskState.RUNNING, TaskState.FINISHED):
        report(log, world, d, "tm-1", 0, state)
    run(world, a, t, lambda: finished(log, "j1"), "the job finishing")
    assert job_state(log, "j1").restarts == 1
    reports = [decode_fields(fields).event for fields in sent.appended]
    inbox_states = [(u.execution_id, u.state) for u in reports if isinstance(u, UpdateTaskExecutionState)]
    assert log.length(job_inbox(log, "j1")) == 0  # archived: its transport is gone
    assert inbox_states == [("src:0:0", TaskState.CANCELED)] + [  # the first attempt, cancelled where it never ran
        ("src:0:1", s) for s in (TaskState.INITIALIZING, TaskState.RUNNING, TaskState.FINISHED)
    ]
    assert [m.execution_id for m in events(log, inbox, CancelTask)] == ["src:0:0"]


def test_an_attempt_its_taskmanager_dropped_without_a_word_fails_and_runs_again(log: EventLog, tmp_path: Path) -> None:
    world, a, t, slots = setup(log, tmp_path)
    submit(log, world, "j1", source_graph("j1"))
    run(world, a, t, lambda: bool(slots.launched), "the deployment")
    report(log, world, launched(slots, 0), "tm-1", 0, TaskState.RUNNING)
    run(
        world,
        a,
        t,
        lambda: a.state.jobs.jobs["j1"].vertices["src"].subtasks[0].state == TaskState.RUNNING,
        "RUNNING recorded",
    )
    t.tasks.pop("j1/src:0:0")  # its end and every report of it lost with the TaskManager's memory of it
    run(world, a, t, lambda: any(d["attempt"] == 1 for _, d, _ in slots.launched), "the next attempt")
    ex = job_state(log, "j1").vertices["src"].subtasks[0]
    assert ex.attempt == 1 and "no longer holds it" in (ex.error or "")


def test_a_task_the_leader_does_not_know_is_cancelled_on_its_taskmanager(log: EventLog, tmp_path: Path) -> None:
    world, a, t, slots = setup(log, tmp_path)
    # A SubmitTask of a job this leader never heard of (its submission was lost with the
    # last second of a Redis that crashed, after the task was sent): the TaskManager runs it.
    sub = SubmitJob(
        "ghost", source_graph("ghost"), Blobs(log).put(CODE), "failover_job", log.keys.inbox(log.keys.client("c1")), {}
    )
    state = JobsState()
    core.decide(state, core.Submit(sub, plan_splits(sub), f"file://{tmp_path}/storage"), world.now)
    job_marker.write(f"file://{tmp_path}/storage", "ghost", [], "jm-host")  # the leader that took it in did
    (msg,) = [
        m
        for _, m in core.decide(state, core.Schedule("ghost", {"tm-1": [0]}), world.now).sends
        if isinstance(m, SubmitTask)
    ]
    inbox = log.keys.inbox(log.keys.taskmanager("tm-1"))
    log.append(inbox, Envelope(msg, world.new_id(), 1, world.now, "ghost"))
    run(world, a, t, lambda: bool(slots.launched), "the ghost task starting")
    run(world, a, t, lambda: not t.tasks, "the ghost task cancelled")
    assert slots.killed == [0]
    cancels = [m for m in events(log, inbox, CancelTask) if m.job_id == "ghost"]
    assert cancels and "its job is not running" in cancels[0].reason
    reports = events(log, log.keys.inbox(log.keys.job("ghost")), UpdateTaskExecutionState)
    assert reports[-1].state == TaskState.CANCELED
    assert "ghost" not in a.state.jobs.jobs


def test_a_cancel_task_lost_on_the_way_is_said_again(log: EventLog, tmp_path: Path) -> None:
    world, a, t, slots = setup(log, tmp_path)
    inbox = log.keys.inbox(log.keys.taskmanager("tm-1"))
    submit(log, world, "j1", source_graph("j1"))
    run(world, a, t, lambda: bool(slots.launched), "the deployment")
    report(log, world, launched(slots, 0), "tm-1", 0, TaskState.RUNNING)
    log.append(
        log.keys.inbox(log.keys.job("j1")), Envelope(CancelJob("j1", "the user"), world.new_id(), 0, world.now, "j1")
    )
    pump(
        [lambda: a.step(block_ms=None)],
        lambda: bool(events(log, inbox, CancelTask)),
        what="the CancelTask",
        world=world,
        advance_ms=10,
    )
    for entry_id, fields in log.backend.xrange(inbox, None, 1000):
        if fields is not None and isinstance(decode_fields(fields).event, CancelTask):
            log.client.xdel(inbox, entry_id)  # lost
    run(world, a, t, lambda: job_state(log, "j1").status == JobStatus.CANCELED, "the job cancelled")
    assert slots.killed == [0] and not t.tasks


def test_a_worker_that_dies_right_after_reporting_finished_keeps_its_partition(log: EventLog, tmp_path: Path) -> None:
    """The producer's worker reports FINISHED to the job and dies before its copy reaches its
    TaskManager. The TaskManager sees a worker die mid-task and reports FAILED (the leader
    ignores it: the attempt FINISHED), but must not delete the partition the consumer is
    about to read: the consumer is deployed and finds it."""
    world, a, t, slots = setup(log, tmp_path)
    submit(log, world, "j1", keyed_graph("j1"))
    run(world, a, t, lambda: bool(slots.launched), "the producer's deployment")
    d = launched(slots, 0)
    assert d["vertex"] == "src" and d["output"] is not None
    partition = Path(d["output"]["path"].removeprefix("file://"))
    partition.mkdir(parents=True)
    (partition / "part-0.parquet").write_bytes(b"rows")  # what the producer wrote
    report(log, world, d, "tm-1", 0, TaskState.RUNNING)
    produced(log, world, d)
    tm_inbox = log.keys.inbox(log.keys.taskmanager("tm-1"))
    losing = LosesWrites(log.backend, tm_inbox, lambda f: b"FINISHED" in next(iter(f.values())))
    report(EventLog(losing, log.keys), world, d, "tm-1", 0, TaskState.FINISHED)
    assert losing.lost == 1
    slots._exited.append((0, "signal 9"))  # and the worker is gone
    run(world, a, t, lambda: any(x["vertex"] == "agg" for _, x, _ in slots.launched), "the consumer's deployment")
    assert (partition / "part-0.parquet").read_bytes() == b"rows"
    job = job_state(log, "j1")
    assert job.vertices["src"].subtasks[0].state == TaskState.FINISHED and job.restarts == 0
