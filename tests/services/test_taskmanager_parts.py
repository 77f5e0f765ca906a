"""The TaskManager's collaborators, each built from what it uses and driven without a
TaskManager: the final states kept for the leader, the inbox's once-only reading, and the
slot pool starting a task, seeing its worker die and reporting it."""

from __future__ import annotations

from pathlib import Path

from sluice.events import Envelope, SubmitTask, TaskDeploymentDescriptor, TaskState, TaskStatesRecorded
from sluice.services.common.metrics import TaskManagerMetrics
from sluice.services.common.shell import get_logger
from sluice.services.taskmanager.inbox import Inbox
from sluice.services.taskmanager.launches import Launches
from sluice.services.taskmanager.library import LibraryCache
from sluice.services.taskmanager.pool import SlotPool
from sluice.services.taskmanager.reach import Reach
from sluice.services.taskmanager.reports import REMEMBERED, FinalStates, JobReports
from sluice.services.taskmanager.spark import SparkShare
from sluice.services.taskmanager.tasks import Task, TaskTable, standard_steps
from sluice.store import Blobs, EventLog
from tests.services.failover_helpers import ManualWorld, TinySlots


def descriptor(execution_id: str = "v:0:0", *, blob: str = "blob", kind: str = "noop") -> TaskDeploymentDescriptor:
    vertex, subtask, attempt = execution_id.split(":")
    return TaskDeploymentDescriptor(
        "j1", execution_id, vertex, int(subtask), int(attempt), 1, 128, kind, blob, "m", [], {}, []
    )


def test_final_states_are_kept_until_confirmed_their_errors_short_and_their_number_bounded() -> None:
    ended: list[TaskState] = []
    finals = FinalStates(ended.append)
    finals.remember(Task(descriptor("v:0:0"), 0), TaskState.FAILED, "x" * 5_000)
    finals.remember(Task(descriptor("v:1:0"), 1), TaskState.FINISHED)
    assert ended == [TaskState.FAILED, TaskState.FINISHED] and len(finals) == 2
    failed, finished = finals.reports()
    assert failed.error is not None and len(failed.error) < 2_100 and failed.error.endswith("(truncated)")
    assert (finished.execution_id, finished.state, finished.error) == ("v:1:0", TaskState.FINISHED, None)
    finals.confirmed(["j1/v:0:0", "j1/unknown"])
    assert [r.execution_id for r in finals.reports()] == ["v:1:0"]
    for i in range(REMEMBERED + 5):
        finals.remember(Task(descriptor(f"w:{i}:0"), 0), TaskState.FINISHED)
    assert len(finals) == REMEMBERED and finals.reports()[0].execution_id == "w:5:0"  # the oldest go first


def test_the_inbox_gives_again_what_was_read_but_not_acknowledged_and_knows_what_was_handled(log: EventLog) -> None:
    world = ManualWorld()
    inbox = Inbox(log, world, "tm-1", retention_ms=0, logger=get_logger("test"), metrics=TaskManagerMetrics())
    inbox.skip()  # the consumer group, made at the end of the (empty) stream
    for session in ("s1", "s2"):
        log.append(
            inbox.stream,
            Envelope(TaskStatesRecorded("tm-1", session, 1, ["j1/v:0:0"]), world.new_id(), 0, world.now_ms()),
        )
    first = inbox.read(None)
    assert [e.envelope.event.session for e in first] == ["s1", "s2"]
    inbox.done(first[0])  # the step fails before the second is handled
    inbox.recover()
    again = inbox.read(None)
    assert [e.id for e in again] == [e.id for e in first] and not inbox.recovering
    assert [inbox.is_new(e) for e in again] == [False, True]
    inbox.ack(again)
    assert inbox.read(None) == []  # acknowledged with this read: nothing pending, nothing new
    state = log.backend.group_state(inbox.stream, inbox.consumer.group)
    assert state is not None and state.pending == 0


def test_the_slot_pool_reports_a_task_whose_worker_died_and_frees_its_slot(log: EventLog, tmp_path: Path) -> None:
    world, workers, tasks = ManualWorld(), TinySlots(log), TaskTable()
    logger, metrics = get_logger("test"), TaskManagerMetrics()
    reports = JobReports(log, world, logger, metrics)
    finals = FinalStates(lambda state: None)
    spark = SparkShare(
        remote=None,
        task_partitions=None,
        cores=None,
        shared_by=None,
        slots=2,
        may_start=False,
        logs=tmp_path / "logs",
        resource_id="tm-1",
        logger=logger,
    )
    launches = Launches(
        log,
        world,
        workers=workers,
        tasks=tasks,
        reports=reports,
        spark=spark,
        resource_id="tm-1",
        host="host-a",
        io_rate=0.0,
        execute=True,
        logger=logger,
        metrics=metrics,
    )
    library = LibraryCache(Blobs(log), tmp_path / "cache")
    steps = standard_steps(library, tasks, tmp_path / "tmp", launches.launch, launches.cancel)
    pool = SlotPool(
        size=2,
        tasks=tasks,
        workers=workers,
        steps=steps,
        launches=launches,
        reports=reports,
        finals=finals,
        reach=Reach("tm-1", "host-a"),
        resource_id="tm-1",
        execute=True,
        logger=logger,
    )
    workers.start(2)
    d = descriptor("v:0:0", blob=Blobs(log).put(b"def f(df):\n    return df\n"))
    pool.submit(SubmitTask("j1", "v:0:0", "v", 0, 0, 1, d))
    assert len(workers.launched) == 1 and pool.free() == 1
    assert [(r.execution_id, r.state) for r in pool.held()] == [("v:0:0", TaskState.RUNNING)]
    workers.kill(1)  # its worker dies
    pool.supervise()
    assert pool.free() == 2 and not reports.owed
    inbox = log.keys.inbox(log.keys.job("j1"))
    states = [env.event.state for _, env in log.replay(inbox) if hasattr(env.event, "state")]
    assert states == [TaskState.INITIALIZING, TaskState.FAILED]
    ((final),) = finals.reports()
    assert final.state == TaskState.FAILED and "slot 1 died" in (final.error or "")
