"""The jobs core, pure: validation, lazy deployment onto slots, waiting for slots, restarts,
failure with the root cause, cancellation, lost TaskManagers, and replay = live."""

from __future__ import annotations

import pytest

from sluice.api import Job
from sluice.errors import UnexpectedJobMessage
from sluice.events import (
    CancelJob,
    CancelTask,
    Envelope,
    JobEdge,
    JobGraph,
    JobSlotsFound,
    JobStatus,
    JobVertex,
    JobWaitingForSlots,
    OperatorEvent,
    RequestNextInputSplit,
    RestartStrategy,
    ScheduleOrUpdateConsumers,
    SourceSpec,
    Success,
    TaskOperationResult,
    TaskSource,
    TaskState,
    UpdateTaskExecutionState,
)
from sluice.services.common.decision import Address
from sluice.services.jobs import core, scheduling
from sluice.services.jobs.state import evolve
from sluice.services.jobs.validate import InvalidJobGraph, problems, validate
from tests.cores import CFG, JobsDriven
from tests.services import jobfixtures


def wordcount(restart: RestartStrategy | None = None, sources: int = 2, reducers: int = 2) -> JobGraph:
    j = Job("wc", restart=restart or RestartStrategy("fixed-delay", 2, 100))
    lines = j.read_text("lines", "/data/in.txt", parallelism=sources)
    words = lines.map("tokenize", jobfixtures.identity)
    words.key_by("word").map("count", jobfixtures.count, parallelism=reducers).write_parquet("out", "/data/out")
    return j.graph()


def copy_job(sources: int) -> JobGraph:
    """One vertex of ``sources`` subtasks that write the lines they read as they are."""
    j = Job("copy")
    j.read_text("lines", "/data/in.txt", parallelism=sources).write_parquet("out", "/data/out")
    return j.graph()


# --- validation ------------------------------------------------------------------------------


def test_chained_operators_make_two_vertices() -> None:
    g = wordcount()
    assert [(v.name, v.kind, len(v.functions), v.sink is not None) for v in g.vertices] == [
        ("lines -> tokenize", "source", 1, False),
        ("count -> out", "transform", 1, True),
    ]
    assert [(e.source, e.target, e.exchange, e.key) for e in g.edges] == [
        ("lines -> tokenize", "count -> out", "keyed", "word")
    ]
    validate(g, jobfixtures)


def graph_with(vertices: list[JobVertex], edges: list[JobEdge], maxp: int = 128) -> JobGraph:
    return JobGraph("bad", vertices, edges, maxp)


SRC = JobVertex("src", "source", 2, source=SourceSpec("text", ["/x"], 100))
OK_FN = "tests.services.jobfixtures:identity"


@pytest.mark.parametrize(
    "graph, says",
    [
        (
            graph_with(
                [SRC, JobVertex("a", "transform", 2, [OK_FN]), JobVertex("b", "transform", 2, [OK_FN])],
                [JobEdge("src", "a", "forward"), JobEdge("a", "b", "forward"), JobEdge("b", "a", "forward")],
            ),
            "the graph has a cycle: a -> b -> a",
        ),
        (
            graph_with([SRC, JobVertex("a", "transform", 2, [OK_FN])], [JobEdge("src", "ghost", "forward")]),
            "refers to a vertex 'ghost' that does not exist",
        ),
        (
            graph_with([JobVertex("src", "source", 0, source=SourceSpec("text", ["/x"], 100))], []),
            "has parallelism 0; it must be between 1 and the max parallelism 128",
        ),
        (
            graph_with([JobVertex("src", "source", 200, source=SourceSpec("text", ["/x"], 100))], []),
            "has parallelism 200",
        ),
        (
            graph_with(
                [SRC, JobVertex("a", "transform", 2, ["tests.services.jobfixtures:nope"])],
                [JobEdge("src", "a", "forward")],
            ),
            "names 'nope', which the job's module does not define",
        ),
        (
            graph_with([SRC, JobVertex("a", "transform", 2, ["m:<lambda>"])], [JobEdge("src", "a", "forward")]),
            "is not importable by name: define it with def at the top level",
        ),
        (graph_with([SRC, SRC], []), "vertex name 'src' is used 2 times"),
        (graph_with([SRC, JobVertex("out", "sink", 2)], []), "sink 'out' has no input"),
        (
            graph_with([SRC, JobVertex("a", "transform", 3, [OK_FN])], [JobEdge("src", "a", "forward")]),
            "needs equal parallelism; use key_by",
        ),
        (
            graph_with([SRC, JobVertex("a", "transform", 2, [OK_FN])], [JobEdge("src", "a", "keyed")]),
            "names no key column",
        ),
        (
            graph_with([SRC, JobVertex("n", "noop", 2)], [JobEdge("src", "n", "keyed", "_")]),
            "no-op vertex 'n' is connected to 'src'; a no-op vertex exchanges nothing",
        ),
    ],
)
def test_invalid_graphs_are_refused_with_what_to_fix(graph: JobGraph, says: str) -> None:
    with pytest.raises(InvalidJobGraph) as info:
        validate(graph, jobfixtures)
    assert says in str(info.value), info.value.problems


def test_a_lambda_transform_is_refused_at_build_time() -> None:
    j = Job("l")
    j.read_text("src", "/x").map("t", lambda df: df).write_parquet("o", "/o")
    assert any("not importable by name" in p for p in problems(j.graph()))


# --- scheduling ----------------------------------------------------------------------------------


def test_sources_deploy_first_spread_over_taskmanagers_and_consumers_wait_for_data() -> None:
    sim = JobsDriven(wordcount(), {"tm-a": 2, "tm-b": 2})
    first = sim.schedule()
    assert [(t.vertex_id, t.subtask) for t in first] == [("lines -> tokenize", 0), ("lines -> tokenize", 1)]
    assert {sim.job.vertices[t.vertex_id].subtasks[t.subtask].taskmanager for t in first} == {"tm-a", "tm-b"}
    assert first[0].descriptor.source == TaskSource(
        "text", {}, "operator-events", {"path": "/data/in.txt", "start": 0, "end": 1, "index": 0}
    )
    for t in first:
        sim.report(t, TaskState.RUNNING)
    assert Address.client("client-inbox") in [d for d, _ in sim.sent] and sim.job.status == JobStatus.RUNNING
    sim.produce(first[0])
    assert sim.schedule() == []  # a keyed consumer needs every producer's partition
    sim.produce(first[1])
    consumers = sim.schedule()
    assert [(t.vertex_id, t.subtask) for t in consumers] == [("count -> out", 0), ("count -> out", 1)]
    (inp,) = consumers[1].descriptor.inputs
    assert inp.key_groups == [64, 127] and len(inp.partition_paths()) == 2
    assert inp.partition_paths()[1].endswith("/1/0")
    for t in first + consumers:
        sim.run_to_end(t)
    assert sim.job.status == JobStatus.FINISHED
    assert sim.state.pool.used == {}


def test_a_job_waits_for_slots_and_runs_when_a_taskmanager_joins_or_fails_after_the_timeout() -> None:
    sim = JobsDriven(wordcount(), {})
    assert sim.schedule() == []
    assert sim.job.waiting_since == sim.now
    sim.slots = {"tm-new": 1}
    sim.now += 500
    (one,) = sim.schedule()
    # the second source still waits: the same wait (one fact), its timeout counted from the slot taken
    assert (sim.job.waiting_since, sim.job.slot_taken_at) == (1_000, 1_500)
    sim.now = 1_500 + CFG.slot_timeout_ms
    assert sim.tell(core.SlotWaits(CFG, total_slots=1)).jobs == []
    sim.now += 1
    assert len(sim.tell(core.SlotWaits(CFG, total_slots=1)).jobs) == 1
    late = JobsDriven(wordcount(), {})
    late.schedule()
    late.now += CFG.slot_timeout_ms + 1
    late.tell(core.SlotWaits(CFG, total_slots=0))
    assert late.job.status == JobStatus.FAILED
    assert "waited 10 s for free slots" in late.job.reason and "sluice scale" in late.job.reason


def test_a_failed_task_is_restarted_after_the_delay_then_the_job_fails_with_the_users_error() -> None:
    sim = JobsDriven(wordcount(RestartStrategy("fixed-delay", 2, 100)), {"tm-a": 4})
    tasks = sim.schedule()
    victim = tasks[0]
    sim.report(victim, TaskState.RUNNING)
    sim.report(victim, TaskState.FAILED, "ValueError: bad row")
    ex = sim.job.vertices[victim.vertex_id].subtasks[0]
    assert (ex.attempt, ex.state, ex.not_before) == (1, TaskState.CREATED, sim.now + 100)
    assert sim.schedule() == []  # not before the delay
    sim.now += 100
    (again,) = sim.schedule()
    assert again.attempt == 1 and again.execution_id == "lines -> tokenize:0:1"
    sim.report(again, TaskState.FAILED, "ValueError: bad row")
    sim.now += 100
    (third,) = sim.schedule()
    sim.report(third, TaskState.RUNNING)
    d = sim.report(third, TaskState.FAILED, "Traceback ...\nValueError: bad row")
    assert sim.job.status == JobStatus.FAILING  # the other source still runs: cancel it
    assert [ev.execution_id for _, ev in d.sends if isinstance(ev, CancelTask)] == ["lines -> tokenize:1:0"]
    sim.report(tasks[1], TaskState.CANCELED)
    assert sim.job.status == JobStatus.FAILED
    assert sim.job.reason.startswith("task lines -> tokenize[0] failed after 2 restarts: Traceback")
    assert "ValueError: bad row" in sim.job.reason


def test_exponential_backoff_doubles_the_delay_up_to_the_maximum() -> None:
    sim = JobsDriven(wordcount(RestartStrategy("exponential-backoff", 5, 100, 300)), {"tm-a": 4})
    delays = []
    task = sim.schedule()[0]
    for _ in range(4):
        sim.report(task, TaskState.FAILED, "boom")
        ex = sim.job.vertices[task.vertex_id].subtasks[0]
        delays.append(ex.not_before - sim.now)
        sim.now = ex.not_before
        task = sim.schedule()[0]
    assert delays == [100, 200, 300, 300]


def test_a_failed_deployment_counts_as_a_failure() -> None:
    sim = JobsDriven(wordcount(RestartStrategy("none")), {"tm-a": 4})
    t = sim.schedule()[0]
    sim.tell(TaskOperationResult("j1", t.execution_id, False, "starting the task failed at step 'temp files'"))
    assert sim.job.status in (JobStatus.FAILING, JobStatus.FAILED)
    assert "step 'temp files'" in sim.job.reason and "restart strategy: none" in sim.job.reason


def test_cancelling_cancels_every_task() -> None:
    sim = JobsDriven(wordcount(), {"tm-a": 4})
    tasks = sim.schedule()
    sim.report(tasks[0], TaskState.RUNNING)
    d = sim.tell(CancelJob("j1", "user asked"))
    assert sorted(ev.execution_id for _, ev in d.sends if isinstance(ev, CancelTask)) == [t.execution_id for t in tasks]
    consumers = sim.job.vertices["count -> out"].subtasks
    assert all(ex.state == TaskState.CANCELED for ex in consumers)  # never deployed
    for t in tasks:
        sim.report(t, TaskState.CANCELED)
    assert sim.job.status == JobStatus.CANCELED and sim.state.pool.used == {}


def test_tasks_on_a_lost_taskmanager_fail_and_restart_elsewhere() -> None:
    sim = JobsDriven(wordcount(), {"tm-a": 1, "tm-b": 1})
    tasks = sim.schedule()
    on_a = next(t for t in tasks if sim.job.vertices[t.vertex_id].subtasks[t.subtask].taskmanager == "tm-a")
    sim.tell(core.TaskManagerGone("tm-a", "no heartbeat", CFG))
    ex = sim.job.vertices[on_a.vertex_id].subtasks[on_a.subtask]
    assert ex.attempt == 1 and "TaskManager tm-a was lost (no heartbeat)" in ex.error
    sim.slots = {"tm-b": 2}
    sim.now += 1000
    assert [t.attempt for t in sim.schedule()] == [1]


def test_stale_and_illegal_updates_change_nothing() -> None:
    sim = JobsDriven(wordcount(), {"tm-a": 4})
    t = sim.schedule()[0]
    sim.report(t, TaskState.RUNNING)
    d = sim.tell(UpdateTaskExecutionState("j1", "lines -> tokenize:0:7", TaskState.FINISHED))
    assert not d.facts and "stale" in d.note
    d = sim.report(t, TaskState.INITIALIZING)
    assert not d.facts and "not a legal move" in d.note


def test_consumers_read_a_restarted_producer_at_its_new_attempt() -> None:
    # Replay = live is not tested here: both sides would fold with the same evolve. The state
    # machine in test_jobs_model.py checks it among the invariants that give it meaning.
    sim = JobsDriven(wordcount(RestartStrategy("fixed-delay", 3, 0)), {"tm-a": 2, "tm-b": 1})
    producers = sim.schedule()
    sim.report(producers[0], TaskState.FAILED, "flaky")
    producers = producers[1:] + sim.schedule()
    assert sorted((t.subtask, t.attempt) for t in producers) == [(0, 1), (1, 0)]
    for t in producers:
        sim.run_to_end(t)
    consumers = sim.schedule()
    assert len(consumers) == 2
    for t in consumers:
        (inp,) = t.descriptor.inputs
        assert [p.split("/")[-2:] for p in inp.partition_paths()] == [["0", "1"], ["1", "0"]]
        sim.run_to_end(t)
    assert sim.job.status == JobStatus.FINISHED and sim.job.restarts == 1
    assert [ev for _, ev in sim.sent if isinstance(ev, Success)] == [Success("j1")]


def test_a_producer_that_finished_before_its_produced_report_arrived_still_lets_its_consumers_run() -> None:
    """A deposed leader can read a producer's "partition complete" report first; the new
    leader reclaims it only after a lease, so the FINISHED sent after it comes first. Finished
    means produced (a worker reports its partition before it finishes): the consumers are
    deployed, and the late report is ignored (found by simulation seed 21108, all faults)."""
    sim = JobsDriven(wordcount(sources=1, reducers=1), {"tm-a": 2})
    (producer,) = sim.schedule()
    sim.run_to_end(producer, produce=False)
    (consumer,) = sim.schedule()
    assert consumer.vertex_id == "count -> out"
    late = sim.tell(
        ScheduleOrUpdateConsumers("j1", producer.execution_id, producer.vertex_id, producer.subtask, producer.attempt)
    )
    assert not late.facts and "not running" in (late.note or "")
    sim.run_to_end(consumer)
    assert sim.job.status == JobStatus.FINISHED
    assert sim.replayed().jobs["j1"].status == JobStatus.FINISHED


def test_a_wait_for_slots_counts_from_when_the_leader_could_schedule_again() -> None:
    """A leader that rebuilt jobs while it served scheduled nothing meanwhile: a job already
    waiting for slots is not failed for that time (``since``), only for the wait after it."""
    sim = JobsDriven(wordcount(sources=3, reducers=1), {"tm-a": 1})
    sim.schedule()
    waiting = sim.job.waiting_since
    assert waiting is not None
    late = waiting + CFG.slot_timeout_ms + 1
    sim.now = late
    assert sim.tell(core.SlotWaits(CFG, 1, since=late - 1000)).jobs == []
    (failed,) = sim.tell(core.SlotWaits(CFG, 1)).jobs
    assert any(getattr(f, "status", None) == JobStatus.FAILING for f in failed.facts)


def _waits(facts: list) -> list[str]:
    return [type(f).__name__ for f in facts if isinstance(f, (JobWaitingForSlots, JobSlotsFound))]


def test_a_job_of_many_tasks_on_few_slots_records_one_wait_not_one_for_every_slot_freed() -> None:
    """30 tasks on 2 slots: a wait when the first pass runs out of slots, its end when the last
    tasks are placed, and nothing in between (it was one JobWaitingForSlots a task: the wait
    ended with every slot taken and began again at the next pass). Replay gives the same."""
    sim = JobsDriven(copy_job(30), {"tm-a": 2})
    running = sim.schedule()
    assert _waits(sim.log) == ["JobWaitingForSlots"] and sim.job.waiting_since == 1_000
    while running:
        sim.now += 10
        done = running.pop(0)
        sim.run_to_end(done)
        running += sim.schedule()
        assert sim.job.slot_taken_at == sim.now or not running or sim.job.waiting_since is None
    assert sim.job.status == JobStatus.FINISHED
    assert _waits(sim.log) == ["JobWaitingForSlots", "JobSlotsFound"]
    assert sim.job.waiting_since is None and sim.replayed().jobs["j1"].waiting_since is None
    # the wait ended with the pass that placed the last two tasks, not at the job's end
    placed_last = [
        i for i, f in enumerate(sim.log) if isinstance(f, UpdateTaskExecutionState) and f.state == TaskState.SCHEDULED
    ][-1]
    assert sim.log.index(next(f for f in sim.log if isinstance(f, JobSlotsFound))) > placed_last


def test_a_wait_recorded_by_an_older_leader_ends_at_the_next_slot_taken_as_it_did() -> None:
    """A v1 JobWaitingForSlots (read with until_placed False) lasted until the job's next slot
    taken; replayed by this version it still does, and a wait that goes on after it is
    recorded again, now as a v2 wait that lasts until JobSlotsFound."""
    sim = JobsDriven(copy_job(4), {})
    old = JobWaitingForSlots("j1", 4, 0, until_placed=False)
    sim.record(core.Decision([old], job_id="j1", now=sim.now))
    evolve(sim.state, Envelope(old, "", 0, sim.now))
    assert sim.job.waiting_since == 1_000 and not sim.job.wait_until_placed
    sim.slots = {"tm-a": 1}
    sim.now += 100
    (first,) = sim.schedule()
    assert sim.job.waiting_since == 1_100 and sim.job.wait_until_placed  # the old wait ended, a new one began
    assert _waits(sim.log) == ["JobWaitingForSlots", "JobWaitingForSlots"]
    assert sim.log[-1].until_placed


def test_a_pass_stopped_at_its_cap_does_not_end_a_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass that deploys MAX_DEPLOY_PER_PASS tasks leaves the rest unlooked at: it cannot say
    every deployable task has a slot (it did, and then began the wait again)."""
    monkeypatch.setattr(scheduling, "MAX_DEPLOY_PER_PASS", 3)
    sim = JobsDriven(copy_job(8), {})
    sim.schedule()
    sim.slots = {"tm-a": 6}
    sim.now += 10
    assert len(sim.schedule()) == 3  # the cap
    assert _waits(sim.log) == ["JobWaitingForSlots"] and sim.job.waiting_since == 1_000
    sim.now += 10
    assert len(sim.schedule()) == 3  # the slots: 2 tasks still wait, in the same wait
    assert _waits(sim.log) == ["JobWaitingForSlots"]
    sim.slots = {"tm-a": 8}
    sim.now += 10
    assert len(sim.schedule()) == 2
    assert _waits(sim.log) == ["JobWaitingForSlots", "JobSlotsFound"] and sim.job.waiting_since is None


def test_a_pass_that_places_the_last_waiting_tasks_at_its_cap_ends_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """At the cap with nothing left to look at, the pass did look at every task: the wait
    ends there (no later pass would: the shell schedules a job only while tasks are ready)."""
    monkeypatch.setattr(scheduling, "MAX_DEPLOY_PER_PASS", 3)
    sim = JobsDriven(copy_job(3), {})
    sim.schedule()
    sim.slots = {"tm-a": 3}
    sim.now += 10
    assert len(sim.schedule()) == 3
    assert _waits(sim.log) == ["JobWaitingForSlots", "JobSlotsFound"] and not sim.job.ready


def test_a_wait_of_an_older_leader_that_no_slot_taken_ended_ends_when_nothing_waits() -> None:
    sim = JobsDriven(copy_job(2), {"tm-a": 2})
    assert len(sim.schedule()) == 2 and _waits(sim.log) == []
    old = JobWaitingForSlots("j1", 1, 0, until_placed=False)  # (as a v1 fact replayed here)
    sim.record(core.Decision([old], job_id="j1", now=sim.now))
    evolve(sim.state, Envelope(old, "", 0, sim.now))
    sim.now += 10
    assert sim.schedule() == []
    assert _waits(sim.log) == ["JobWaitingForSlots", "JobSlotsFound"] and sim.job.waiting_since is None


def test_more_tasks_than_slots_deploy_in_order_and_a_pass_stops_at_the_first_without_a_slot() -> None:
    """40 source subtasks on 3 slots: each pass deploys as many as there are free slots, in
    subtask order, and leaves the rest queued in that order; the pass stops at the first
    task that finds no slot (it looked at all 40 each time: O(N^2) for a big job)."""
    sim = JobsDriven(copy_job(40), {"tm-a": 2, "tm-b": 1})
    order = []
    while len(order) < 40:
        deployed = sim.schedule()
        assert 1 <= len(deployed) <= 3
        order += [t.subtask for t in deployed]
        queued = [ex.subtask for ex in sim.job.ready if ex.state == TaskState.CREATED]
        assert queued == list(range(len(order), 40))  # the rest, in order, none lost
        for task in deployed:
            sim.run_to_end(task)
    assert order == list(range(40)) and sim.job.status == JobStatus.FINISHED
    assert sim.replayed().jobs["j1"].status == JobStatus.FINISHED


def test_an_all_to_all_no_op_job_deploys_its_consumers_once_every_producer_finished() -> None:
    """The control-plane benchmark's job (``scripts/bench alltoall``): no-op vertices joined
    all-to-all. Nothing is produced (a no-op writes no partition), so each consumer waits
    for every producer's FINISHED, as it would for every producer's partition."""
    j = Job("a2a", max_parallelism=128)
    j.noop("a", parallelism=3)
    j.noop("b", parallelism=2, after="a")
    validate(j.graph())
    sim = JobsDriven(j.graph(), {"tm-a": 8})
    producers = sim.schedule()
    assert [t.vertex_id for t in producers] == ["a", "a", "a"]
    for t in producers[:2]:
        sim.report(t, TaskState.RUNNING)
        sim.report(t, TaskState.FINISHED)
    assert sim.schedule() == []  # one producer still runs
    sim.report(producers[2], TaskState.RUNNING)
    sim.report(producers[2], TaskState.FINISHED)
    consumers = sim.schedule()
    assert sorted(t.subtask for t in consumers) == [0, 1] and {t.vertex_id for t in consumers} == {"b"}
    for t in consumers:
        sim.report(t, TaskState.RUNNING)
        sim.report(t, TaskState.FINISHED)
    assert sim.job.status == JobStatus.FINISHED
    assert sim.replayed().jobs["j1"].status == JobStatus.FINISHED


def test_the_moved_attempts_cache_follows_a_restart() -> None:
    """Consumers' descriptors share a producer vertex's moved attempts (O(N) to deploy N
    all-to-all consumers): a restart of one of its subtasks must show in the next one."""
    sim = JobsDriven(wordcount(RestartStrategy("fixed-delay", 3, 0)), {"tm-a": 2, "tm-b": 1})
    producers = sim.schedule()
    vertex = sim.job.vertices[producers[0].vertex_id]
    assert vertex.moved_attempts(sim.job.floor) == {}
    sim.report(producers[0], TaskState.FAILED, "flaky")
    assert vertex.moved_attempts(sim.job.floor) == {str(producers[0].subtask): 1}
    assert sim.replayed().jobs["j1"].vertices[vertex.spec.name].moved_attempts(sim.job.floor) == {
        str(producers[0].subtask): 1
    }


def test_a_split_request_is_recorded_with_the_leaders_time_as_the_coordinators_clock() -> None:
    """The fact says when the leader took the request (whatever the subtask sent): the
    source's coordinator paces its readers by it, and a replay must see the same time."""
    sim = JobsDriven(wordcount(), {"tm-a": 2})
    first = sim.schedule()
    sim.report(first[0], TaskState.RUNNING)
    sim.now = 7_000
    sim.tell(RequestNextInputSplit("j1", first[0].vertex_id, 0, first[0].execution_id, "h", 1, at=123))
    sim.tell(OperatorEvent("j1", first[0].vertex_id, 0, True, {"type": "request-split"}, first[0].attempt, 2))
    recorded = [ev for ev in sim.log if isinstance(ev, (RequestNextInputSplit, OperatorEvent))]
    assert [(type(ev).__name__, ev.at) for ev in recorded] == [
        ("RequestNextInputSplit", 7_000),
        ("OperatorEvent", 7_000),
    ]


def test_a_message_a_job_inbox_does_not_take_is_rejected_not_raised() -> None:
    """The door never raises (Temporal's ``activate``): the refusal is the decision, and the
    shell parks the message with its reason."""
    sim = JobsDriven(wordcount(), {"tm-a": 2})
    d = sim.tell(Success("j1"))
    assert isinstance(d.rejected, UnexpectedJobMessage) and "Success is not a message a job inbox takes" in str(
        d.rejected
    )
    assert (d.facts, d.sends, d.job_id) == ([], [], "j1")
