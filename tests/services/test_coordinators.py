"""Operator coordinators on the JobManager (``JobCoordinators``), pure: no Redis, no
JobManager. The test plays the JobManager's main loop: it feeds the job's facts
(``feed``), takes what the coordinators did (``flush``) and, for a takeover, builds a
new ``JobCoordinators`` from the log the way a new leader does (the last
``CoordinatorCheckpointed`` of each operator, then ``replay`` of the facts after it).

Modeled on what Flink's SourceCoordinatorTest and OperatorCoordinatorSchedulerTest
check: events reach the right subtask and attempt in both directions, a failed subtask's
splits are assigned again, checkpoint and restore give the same state, deterministic
replay is checked, held-back events are released with the checkpoint that covers them,
coordinator failures fail the job and silence the coordinator, an unbound context is
refused, and a coordinator's own thread can send while the main loop checkpoints.

Four tests here began as strict xfails that showed bugs in the runtime, since fixed.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from types import SimpleNamespace
from typing import Any, ClassVar

import orjson
import pytest

from sluice.events import (
    CoordinatorCheckpointed,
    Event,
    JobVertex,
    NextInputSplit,
    OperatorEvent,
    RequestNextInputSplit,
    SourceSpec,
    TaskRestartScheduled,
    TaskState,
    UpdateTaskExecutionState,
)
from sluice.services.coordination.coordinator import ContextNotBound, CoordinatorContext, OperatorCoordinator
from sluice.services.coordination.runtime import JobCoordinators, operator_of
from sluice.services.coordination.source import NO_MORE, REQUEST, SPLIT, plan_range
from tests.cores import flushed

JOB = "job-1"


# --- test coordinators (module level: the loader finds them by ``module:qualname``) -------------


class Echo(OperatorCoordinator):
    """Answers an event from subtask s with one to subtask (s + 1) % p; records every call
    the framework makes, and its state is what it got."""

    def __init__(self, context: CoordinatorContext) -> None:
        super().__init__(context)
        self.got: list[tuple[int, int, Any]] = []
        self.calls: list[tuple] = []
        self.completed: list[int] = []

    def start(self) -> None:
        self.calls.append(("start",))

    def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
        self.calls.append(("event", subtask, attempt, event))
        self.got.append((subtask, attempt, event))
        self.context.send_event((subtask + 1) % self.context.parallelism, {"echo": event, "from": subtask})

    def checkpoint_coordinator(self, checkpoint_id: int) -> Any:
        self.calls.append(("checkpoint", checkpoint_id))
        return {"got": [list(g) for g in self.got]}

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.calls.append(("complete", checkpoint_id))
        self.completed.append(checkpoint_id)

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        self.calls.append(("reset", checkpoint_id))
        self.got = [tuple(g) for g in state["got"]]

    def subtask_failed(self, subtask: int, attempt: int, reason: str | None) -> None:
        self.calls.append(("failed", subtask, attempt, reason))

    def subtask_reset(self, subtask: int, attempt: int) -> None:
        self.calls.append(("reset-subtask", subtask, attempt))

    def subtask_ready(self, subtask: int, attempt: int) -> None:
        self.calls.append(("ready", subtask, attempt))

    def subtask_finished(self, subtask: int, attempt: int) -> None:
        self.calls.append(("finished", subtask, attempt))


class DeterministicEcho(Echo):
    deterministic = True


class FailInHandle(Echo):
    def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
        super().handle_event_from_operator(subtask, attempt, event)
        raise RuntimeError("boom in handle_event_from_operator")


class FailInStart(Echo):
    def start(self) -> None:
        super().start()
        raise RuntimeError("boom in start")


class FailInCheckpoint(Echo):
    def checkpoint_coordinator(self, checkpoint_id: int) -> Any:
        super().checkpoint_coordinator(checkpoint_id)
        return {"not json": {1, 2, 3}}


class FailInAsync(Echo):
    def start(self) -> None:
        super().start()

        def work() -> None:
            raise RuntimeError("boom on the coordinator thread")

        self.context.call_async(work)


class FailInThen(Echo):
    def start(self) -> None:
        super().start()

        def then(result: int) -> None:
            raise RuntimeError(f"boom in then({result})")

        self.context.call_async(lambda: 42, then)


class FailsTheJob(Echo):
    def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
        super().handle_event_from_operator(subtask, attempt, event)
        self.context.fail_job("the coordinator gave up: boom by fail_job")


class SendsInReset(Echo):
    """Sends from ``reset_to_checkpoint``: the context is not bound yet."""

    caught: ClassVar[list[BaseException]] = []

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        super().reset_to_checkpoint(checkpoint_id, state)
        try:
            self.context.send_event(0, "too early")
        except ContextNotBound as exc:
            SendsInReset.caught.append(exc)
            raise


class SendsInInit(Echo):
    def __init__(self, context: CoordinatorContext) -> None:
        super().__init__(context)
        context.send_event(0, "too early")


class Chatty(OperatorCoordinator):
    """Its own thread sends ``N`` events to subtask 0, each under the lock together with the
    counter the checkpoint records; events from subtasks are answered to subtask 1."""

    N = 10_000

    def __init__(self, context: CoordinatorContext) -> None:
        super().__init__(context)
        self.sent = 0
        self.answered = 0
        self.done = threading.Event()
        self.thread: threading.Thread | None = None

    def run(self) -> None:
        for _ in range(self.N):
            with self.context.lock:
                self.sent += 1
                self.context.send_event(0, {"by": "thread", "n": self.sent})
            if self.sent % 250 == 0:
                time.sleep(0.0005)  # let the main loop in now and then
        self.done.set()

    def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
        self.answered += 1
        self.context.send_event(1, {"by": "main", "n": self.answered})

    def checkpoint_coordinator(self, checkpoint_id: int) -> Any:
        return {"thread": self.sent, "main": self.answered}

    def close(self) -> None:
        if self.thread is not None:
            self.thread.join(5)


class ChattyThread(Chatty):
    def start(self) -> None:
        self.thread = threading.Thread(target=self.run, name="chatty", daemon=True)
        self.thread.start()


class ChattyAsync(Chatty):
    def start(self) -> None:
        self.context.call_async(self.run)


class SlowWork(OperatorCoordinator):
    """Hands each input to its thread; the result is sent from ``then`` on the main loop.
    Its state counts inputs whose result has not come back (a restore redoes them) and
    results sent. To checkpoint, it lets the work in hand finish and waits until its
    thread is idle (the result is then queued for ``then``)."""

    def __init__(self, context: CoordinatorContext) -> None:
        super().__init__(context)
        self.in_flight = 0
        self.sent = 0
        self.go = threading.Event()

    def handle_event_from_operator(self, subtask: int, attempt: int, event: Any) -> None:
        self.in_flight += 1
        self.go.clear()

        def work() -> Any:
            self.go.wait(5)
            return event

        def then(result: Any) -> None:
            self.in_flight -= 1
            self.sent += 1
            self.context.send_event(subtask, {"result": result})

        self.context.call_async(work, then)

    def checkpoint_coordinator(self, checkpoint_id: int) -> Any:
        self.go.set()
        idle = threading.Event()
        self.context.call_async(idle.set)
        assert idle.wait(5)
        return {"in_flight": self.in_flight, "sent": self.sent}


class LiveState(OperatorCoordinator):
    """Returns its live state object from ``checkpoint_coordinator``."""

    def __init__(self, context: CoordinatorContext) -> None:
        super().__init__(context)
        self.state = {"sent": 0}

    def send(self, subtask: int) -> None:  # called from the coordinator's own thread
        with self.context.lock:
            self.state["sent"] += 1
            self.context.send_event(subtask, self.state["sent"])

    def checkpoint_coordinator(self, checkpoint_id: int) -> Any:
        return self.state

    def reset_to_checkpoint(self, checkpoint_id: int, state: Any) -> None:
        self.state = dict(state)


class Greeter(DeterministicEcho):
    """Deterministic, and says hello to subtask 0 whenever it starts (on every leader)."""

    def start(self) -> None:
        super().start()
        self.context.send_event(0, "hello")


# --- helpers -----------------------------------------------------------------------------------


def load(ref: str) -> type:
    module, _, qualname = ref.partition(":")
    assert module == __name__
    return globals()[qualname]


def user_vertex(cls: type, name: str = "op", parallelism: int = 3) -> JobVertex:
    return JobVertex(name, "transform", parallelism, coordinator=f"{__name__}:{cls.__name__}")


def source_vertex(
    protocol: str = "operator-events", parallelism: int = 2, name: str = "src", each_split: bool = False
) -> JobVertex:
    return JobVertex(
        name,
        "source",
        parallelism,
        source=SourceSpec("range", [], 10, {"start": "0", "end": "50"}, protocol, each_split),
    )


def coordinators(
    *vertices: JobVertex, splits: dict[str, list] | None = None, interval_ms: int = 10_000, start: bool = True
) -> JobCoordinators:
    if splits is None:
        splits = {v.name: plan_range(0, 50, 10) for v in vertices if v.kind == "source"}
    j = JobCoordinators(JOB, vertices, splits, load, interval_ms=interval_ms)
    if start:
        j.start(0)
    return j


def coordinator(j: JobCoordinators, op: str = "op") -> Any:
    return j.holders[op].coordinator


def to_coordinator(op: str, subtask: int, body: Any, attempt: int = 0) -> OperatorEvent:
    return OperatorEvent(JOB, op, subtask, True, body, attempt)


def to_subtask(op: str, subtask: int, body: Any, attempt: int = 0) -> OperatorEvent:
    return OperatorEvent(JOB, op, subtask, False, body, attempt)


def task_state(op: str, subtask: int, attempt: int, state: TaskState, error: str | None = None) -> Event:
    return UpdateTaskExecutionState(JOB, f"{op}:{subtask}:{attempt}", state, error, op, subtask, attempt, "tm-1", 0)


def restart(op: str, subtask: int, attempt: int) -> TaskRestartScheduled:
    return TaskRestartScheduled(JOB, op, subtask, attempt, 0, attempt)


def sends(flush: SimpleNamespace) -> list[tuple[Event, Any]]:
    return [(ev, to) for ev, to in flush.facts if not isinstance(ev, CoordinatorCheckpointed)]


def checkpoints(flush: SimpleNamespace) -> list[CoordinatorCheckpointed]:
    return [ev for ev, _ in flush.facts if isinstance(ev, CoordinatorCheckpointed)]


def json(value: Any) -> Any:
    """As the log gives it back."""
    return orjson.loads(orjson.dumps(value))


class Log:
    """The job's facts as the JobManager commits them: inputs, then what the flush gave."""

    def __init__(self, j: JobCoordinators) -> None:
        self.j = j
        self.facts: list[Event] = []

    def step(self, *inputs: Event, now: int = 0, force: bool = False) -> SimpleNamespace:
        for ev in inputs:
            self.j.feed(ev)
            self.facts.append(ev)
        out = flushed(self.j.flush(now, force=force))
        self.facts += [ev for ev, _ in out.facts]
        self.j.committed()
        return out

    def takeover(self, *vertices: JobVertex, tamper: Any = None) -> JobCoordinators:
        """A new leader: coordinators created, restored from their last checkpoint, started
        and fed the facts after it (as ``JobManager.become_leader`` does)."""
        checkpoints: dict[str, tuple[int, Any, list[int]]] = {}
        tails: dict[str, list[Event]] = {}
        attempts = {v.name: [0] * v.parallelism for v in vertices}  # the ExecutionGraph's, as replayed
        for ev in json_facts(self.facts):
            if isinstance(ev, TaskRestartScheduled) and ev.vertex_id in attempts:
                attempts[ev.vertex_id][ev.subtask] = ev.attempt
            op = operator_of(ev)
            if op is None:
                continue
            if isinstance(ev, CoordinatorCheckpointed):
                checkpoints[op] = (ev.checkpoint_id, ev.state, list(attempts.get(op, [])) or None)
                tails[op] = []
            else:
                tails.setdefault(op, []).append(ev)
        if tamper is not None:
            tamper(tails)
        j = coordinators(*vertices, start=False)
        for op, (cid, state, at) in checkpoints.items():
            j.restore(op, cid, state, at)
        j.start(0)
        j.replay(tails)
        return j


def json_facts(facts: list[Event]) -> list[Event]:
    """Facts with their JSON fields as decoded from the log (a fresh copy)."""
    out = []
    for ev in facts:
        fields = {f.name: getattr(ev, f.name) for f in dataclasses.fields(ev)}
        out.append(type(ev)(**{k: json(v) if isinstance(v, (dict, list)) else v for k, v in fields.items()}))
    return out


# --- events between the coordinator and its subtasks -----------------------------------------------


def test_events_from_the_coordinator_reach_the_right_subtask_and_attempt() -> None:
    j = coordinators(user_vertex(DeterministicEcho, parallelism=3))
    first = flushed(j.flush(0))
    assert [c.checkpoint_id for c in checkpoints(first)] == [0]  # a started coordinator is checkpointed at once
    j.feed(restart("op", 2, 1))  # subtask 2 runs again as attempt 1
    for s in range(3):
        j.feed(to_coordinator("op", s, f"hi from {s}"))
    out = flushed(j.flush(0))
    assert out.failures == []
    assert out.facts == [
        (to_subtask("op", 1, {"echo": "hi from 0", "from": 0}, 0), ("op", 1)),
        (to_subtask("op", 2, {"echo": "hi from 1", "from": 1}, 1), ("op", 2)),
        (to_subtask("op", 0, {"echo": "hi from 2", "from": 2}, 0), ("op", 0)),
    ]
    assert all(not ev.to_coordinator for ev, _ in out.facts)


def test_events_from_a_subtask_reach_the_coordinator() -> None:
    j = coordinators(user_vertex(Echo), user_vertex(Echo, name="other"))
    j.feed(to_coordinator("op", 2, {"n": 1}, attempt=3))
    j.feed(to_coordinator("op", 0, [1, 2], attempt=0))
    j.feed(to_subtask("op", 1, "to a subtask: not for the coordinator"))
    j.feed(to_coordinator("nobody", 0, "no such operator"))
    assert coordinator(j).got == [(2, 3, {"n": 1}), (0, 0, [1, 2])]
    assert coordinator(j, "other").got == []


def test_subtask_lifecycle_reaches_the_coordinator() -> None:
    j = coordinators(user_vertex(Echo))
    for ev in (
        task_state("op", 0, 0, TaskState.DEPLOYING),
        task_state("op", 0, 0, TaskState.RUNNING),
        task_state("op", 1, 0, TaskState.FAILED, "oom"),
        restart("op", 1, 1),
        task_state("op", 2, 0, TaskState.CANCELED),
        task_state("op", 0, 0, TaskState.FINISHED),
        task_state("elsewhere", 0, 0, TaskState.FAILED),
    ):
        j.feed(ev)
    assert coordinator(j).calls == [
        ("start",),
        ("ready", 0, 0),
        ("failed", 1, 0, "oom"),
        ("reset-subtask", 1, 1),
        ("failed", 2, 0, None),
        ("finished", 0, 0),
    ]
    assert coordinator(j).context.current_attempt(1) == 1


def test_events_to_a_subtask_that_is_not_running_wait_in_its_inbox() -> None:
    j = coordinators(user_vertex(DeterministicEcho, parallelism=2))
    j.flush(0)
    ctx = coordinator(j).context
    ctx.send_event(1, "early")  # no subtask is ready yet
    out = flushed(j.flush(0))
    assert out.facts == [(to_subtask("op", 1, "early", 0), ("op", 1))]
    j.feed(task_state("op", 1, 0, TaskState.FAILED, "lost"))
    j.feed(restart("op", 1, 1))
    ctx.send_event(1, "later")  # for the attempt that runs next
    ctx.send_event(1, "for the old one", attempt=0)
    out = flushed(j.flush(0))
    assert out.facts == [
        (to_subtask("op", 1, "later", 1), ("op", 1)),
        (to_subtask("op", 1, "for the old one", 0), ("op", 1)),
    ]
    with pytest.raises(ValueError, match="subtasks 0..1; there is no subtask 2"):
        ctx.send_event(2, "nobody")


# --- the source coordinator: split assignment through the framework ---------------------------------


def request(protocol: str, subtask: int, attempt: int, host: str = "", at: int = 0) -> Event:
    """A request as the leader records it (``at``: when; 0 in facts that do not say)."""
    if protocol == "input-splits":
        return RequestNextInputSplit(JOB, "src", subtask, f"src:{subtask}:{attempt}", host, 0, at)
    return OperatorEvent(JOB, "src", subtask, True, {"type": REQUEST, "host": host}, attempt, 0, at)


def answer(protocol: str, subtask: int, attempt: int, split: dict | None) -> tuple[Event, Any]:
    if protocol == "input-splits":
        return NextInputSplit(JOB, f"src:{subtask}:{attempt}", split), ("src", subtask)
    body = {"type": NO_MORE} if split is None else {"type": SPLIT, "split": split}
    return to_subtask("src", subtask, body, attempt), ("src", subtask)


@pytest.mark.parametrize("protocol", ["operator-events", "input-splits"])
def test_a_failed_subtasks_splits_are_added_back_and_assigned_again(protocol: str) -> None:
    plan = plan_range(0, 50, 10)
    j = coordinators(source_vertex(protocol))
    j.flush(0)

    def ask(subtask: int, attempt: int) -> list:
        j.feed(request(protocol, subtask, attempt))
        out = flushed(j.flush(0))
        assert out.failures == []
        return out.facts

    assert ask(0, 0) == [answer(protocol, 0, 0, plan[0])]
    assert ask(1, 0) == [answer(protocol, 1, 0, plan[1])]
    assert ask(0, 0) == [answer(protocol, 0, 0, plan[2])]
    j.feed(task_state("src", 0, 0, TaskState.FAILED, "disk full"))
    j.feed(restart("src", 0, 1))
    assert coordinator(j, "src").enumerator.assigner.pool() == [0, 2, 3, 4]
    assert ask(0, 1) == [answer(protocol, 0, 1, plan[0])]  # the same splits, to the new attempt
    assert ask(0, 1) == [answer(protocol, 0, 1, plan[2])]
    assert ask(0, 1) == [answer(protocol, 0, 1, plan[3])]
    j.feed(task_state("src", 1, 0, TaskState.FINISHED))
    j.feed(task_state("src", 1, 0, TaskState.CANCELED))  # finished splits are done: nothing goes back
    assert ask(1, 0) == [answer(protocol, 1, 0, plan[4])]
    assert ask(1, 0) == [answer(protocol, 1, 0, None)]
    assert coordinator(j, "src").enumerator.assigner.done == 1


def test_the_source_coordinator_prefers_the_requesters_host() -> None:
    splits = [
        {"format": "text", "path": f"/f{i}", "hosts": hosts} for i, hosts in enumerate([["a"], ["b"], ["a", "b"], []])
    ]
    j = coordinators(source_vertex(), splits={"src": splits})
    j.flush(0)
    for subtask, host, want in [(0, "b", 1), (1, "a", 0), (0, "x", 2), (1, "b", 3), (1, "a", None)]:
        j.feed(request("operator-events", subtask, 0, host))
        assert flushed(j.flush(0)).facts == [
            answer("operator-events", subtask, 0, None if want is None else splits[want])
        ]


def test_the_source_coordinator_refuses_other_events() -> None:
    j = coordinators(source_vertex())
    j.feed(to_coordinator("src", 0, {"type": "hello"}))
    out = flushed(j.flush(0))
    assert out.facts == [] and len(out.failures) == 1
    assert "takes only {'type': 'request-split'" in out.failures[0]


# --- checkpoints, restore and replay -------------------------------------------------------------


def test_checkpoint_then_restore_gives_the_same_coordinator_state() -> None:
    vertices = (source_vertex(), user_vertex(Echo))
    j1 = coordinators(*vertices)
    j1.flush(0)
    for ev in (
        request("operator-events", 0, 0),
        request("operator-events", 1, 0, "h"),
        to_coordinator("op", 0, "x"),
        request("operator-events", 0, 0),
        task_state("src", 0, 0, TaskState.FAILED, "x"),
        restart("src", 0, 1),
    ):
        j1.feed(ev)
    cut = flushed(j1.flush(0, force=True))
    taken = {c.operator_id: c for c in checkpoints(cut)}
    assert set(taken) == {"src", "op"}
    assert cut.facts[-1] == (taken["op"], None) and taken["op"].released == 1  # after the echo it released

    j2 = coordinators(*vertices, start=False)
    for op, c in taken.items():
        j2.restore(op, c.checkpoint_id, json(c.state))
    j2.start(0)
    assert coordinator(j2, "src").enumerator.assigner == coordinator(j1, "src").enumerator.assigner
    assert coordinator(j2, "op").got == coordinator(j1, "op").got
    again1, again2 = flushed(j1.flush(0, force=True)), flushed(j2.flush(0, force=True))
    assert again2.facts == again1.facts  # the same state at the same checkpoint id
    later = (
        restart("src", 0, 1),
        request("operator-events", 0, 1),
        request("operator-events", 1, 0),
        to_coordinator("op", 2, "y"),
        task_state("src", 1, 0, TaskState.FAILED),
        request("operator-events", 0, 1),
    )
    for ev in later:
        j1.feed(ev)
        j2.feed(ev)
        f1, f2 = flushed(j1.flush(0)), flushed(j2.flush(0))
        assert f2.facts == f1.facts and f1.failures == f2.failures == []
    assert flushed(j2.flush(0, force=True)).facts == flushed(j1.flush(0, force=True)).facts


@pytest.mark.parametrize("protocol", ["operator-events", "input-splits"])
def test_replay_of_a_deterministic_coordinator_checks_its_answers(protocol: str) -> None:
    v = source_vertex(protocol)
    log = Log(coordinators(v))
    log.step()  # the first checkpoint
    log.step(request(protocol, 0, 0), request(protocol, 1, 0), force=True)
    log.step(request(protocol, 0, 0))
    log.step(task_state("src", 0, 0, TaskState.FAILED, "x"), restart("src", 0, 1))
    log.step(request(protocol, 1, 0), request(protocol, 0, 1))

    # a faithful log: the new leader answers the same, muted, and goes on like the old one
    j2 = log.takeover(v)
    assert flushed(j2.flush(0)).failures == []
    for ev in (request(protocol, 0, 1), request(protocol, 1, 0), request(protocol, 1, 0)):
        log.j.feed(ev)
        j2.feed(ev)
        f1, f2 = flushed(log.j.flush(0)), flushed(j2.flush(0))
        assert f2.facts == f1.facts and f2.failures == []

    # a log whose recorded answer differs from what the coordinator answers now
    def other_split(tails: dict) -> None:
        tail = tails["src"]
        i = max(
            k
            for k, ev in enumerate(tail)
            if isinstance(ev, (NextInputSplit, OperatorEvent)) and not getattr(ev, "to_coordinator", False)
        )
        ev = tail[i]
        wrong = plan_range(0, 50, 10)[4]
        if isinstance(ev, NextInputSplit):
            tail[i] = NextInputSplit(JOB, ev.execution_id, wrong)
        else:
            tail[i] = to_subtask("src", ev.subtask, {"type": SPLIT, "split": wrong}, ev.attempt)
        assert tail[i] != ev

    failures = flushed(log.takeover(v, tamper=other_split).flush(0)).failures
    assert len(failures) == 1
    assert "declared deterministic" in failures[0] and "first difference" in failures[0]
    assert "set deterministic = False" in failures[0]

    # a log that lacks an answer
    def one_answer_fewer(tails: dict) -> None:
        tail = tails["src"]
        last = max(
            k
            for k, ev in enumerate(tail)
            if isinstance(ev, (NextInputSplit, OperatorEvent)) and not getattr(ev, "to_coordinator", False)
        )
        del tail[last]

    failures = flushed(log.takeover(v, tamper=one_answer_fewer).flush(0)).failures
    assert len(failures) == 1 and "declared deterministic" in failures[0] and "one list is longer" in failures[0]


@pytest.mark.parametrize("protocol", ["operator-events", "input-splits"])
def test_a_source_read_each_split_holds_a_slow_reader_back_from_the_last_splits_also_after_a_takeover(
    protocol: str,
) -> None:
    """The end game through the framework: the time of each request comes from its fact
    (``at``), so a new leader that replays the requests after the last checkpoint holds the
    same reader back, and the deterministic replay check passes."""
    plan = plan_range(0, 50, 10)  # 5 splits
    v = source_vertex(protocol, each_split=True)
    log = Log(coordinators(v))
    log.step()
    out = log.step(request(protocol, 0, 0, at=1000), request(protocol, 1, 0, at=1000))  # both start
    assert sends(out) == [answer(protocol, 0, 0, plan[0]), answer(protocol, 1, 0, plan[1])]
    log.step(request(protocol, 0, 0, at=1100), force=True)  # reader 0: 100 ms a split; checkpoint
    log.step(request(protocol, 0, 0, at=1200))  # splits 2, 3 to reader 0; one left
    out = log.step(request(protocol, 1, 0, at=1250))  # reader 1: 250 ms a split
    # reader 0 (free at 1300) finishes the last split at 1400, reader 1 would at 1500
    assert sends(out) == [answer(protocol, 1, 0, None)]

    j2 = log.takeover(v)  # replays the requests after the checkpoint, with their times
    assert flushed(j2.flush(0)).failures == []
    assert coordinator(j2, "src").enumerator.assigner == coordinator(log.j, "src").enumerator.assigner
    for j in (log.j, j2):
        j.feed(request(protocol, 0, 0, at=1300))
        assert sends(flushed(j.flush(0))) == [answer(protocol, 0, 0, plan[4])]

    # the same requests without times, or to a source read whole: no end game
    for at, each_split in ((0, True), (1, False)):
        other = Log(coordinators(source_vertex(protocol, each_split=each_split)))
        other.step()
        other.step(request(protocol, 0, 0, at=1000 * at), request(protocol, 1, 0, at=1000 * at))
        other.step(request(protocol, 0, 0, at=1100 * at), request(protocol, 0, 0, at=1200 * at))
        assert sends(other.step(request(protocol, 1, 0, at=1250 * at))) == [answer(protocol, 1, 0, plan[4])]


def test_replay_of_a_non_deterministic_coordinator_answers_inputs_again() -> None:
    v = user_vertex(Echo, parallelism=2)
    log = Log(coordinators(v))
    log.step()
    log.step(to_coordinator("op", 0, "a"))
    # the leader recorded "b" but died before its answer was released with a checkpoint
    log.facts.append(to_coordinator("op", 1, "b"))
    j2 = log.takeover(v)
    assert coordinator(j2).got == [(0, 0, "a"), (1, 0, "b")]
    out = flushed(j2.flush(0))
    assert out.failures == []
    assert sends(out) == [(to_subtask("op", 0, {"echo": "b", "from": 1}), ("op", 0))]
    assert [c.released for c in checkpoints(out)] == [1]


# --- held-back events of non-deterministic coordinators ------------------------------------------------


def test_held_back_events_are_released_with_the_checkpoint_that_covers_them() -> None:
    j = coordinators(user_vertex(Echo, parallelism=2))
    assert [(c.checkpoint_id, c.released) for c in checkpoints(flushed(j.flush(0)))] == [(0, 0)]
    j.committed()
    assert coordinator(j).completed == [0]
    for body in ("a", "b", "c"):
        j.feed(to_coordinator("op", 0, body))
    assert len(j.holders["op"].context._queue) == 3  # sent, not released yet
    out = flushed(j.flush(0))  # not forced, not due: the held events force a checkpoint
    assert out.failures == []
    assert out.facts == [
        (to_subtask("op", 1, {"echo": "a", "from": 0}), ("op", 1)),
        (to_subtask("op", 1, {"echo": "b", "from": 0}), ("op", 1)),
        (to_subtask("op", 1, {"echo": "c", "from": 0}), ("op", 1)),
        (CoordinatorCheckpointed(JOB, "op", 1, {"got": [[0, 0, "a"], [0, 0, "b"], [0, 0, "c"]]}, 3), None),
    ]
    assert coordinator(j).completed == [0]  # not committed yet
    j.committed()
    j.committed()
    assert coordinator(j).completed == [0, 1]
    assert flushed(j.flush(0)).facts == []  # nothing new: no checkpoint
    coordinator(j).context.send_event(0, "from its own thread")
    out = flushed(j.flush(0))
    assert [type(ev).__name__ for ev, _ in out.facts] == ["OperatorEvent", "CoordinatorCheckpointed"]
    assert checkpoints(out)[0].released == 1


def test_a_deterministic_coordinator_releases_without_a_checkpoint() -> None:
    j = coordinators(user_vertex(DeterministicEcho, parallelism=2))
    j.flush(0)
    j.feed(to_coordinator("op", 0, "a"))
    out = flushed(j.flush(0))
    assert out.facts == [(to_subtask("op", 1, {"echo": "a", "from": 0}), ("op", 1))]


def test_held_back_events_are_never_released_without_their_checkpoint() -> None:
    j = coordinators(user_vertex(FailInCheckpoint, parallelism=2), start=False)
    j.holders["op"].checkpoint_id = 0  # as if restored: no checkpoint at start
    j.start(0)
    j.feed(to_coordinator("op", 0, "a"))
    out = flushed(j.flush(0))
    assert out.facts == [] and len(out.failures) == 1  # the checkpoint failed: the echo stays held


def test_checkpoints_are_taken_when_due_or_requested() -> None:
    j = coordinators(user_vertex(DeterministicEcho), interval_ms=100)
    assert checkpoints(flushed(j.flush(0)))
    j.feed(to_coordinator("op", 0, "a"))
    assert checkpoints(flushed(j.flush(50))) == []
    assert [c.checkpoint_id for c in checkpoints(flushed(j.flush(100)))] == [
        1
    ]  # inputs arrived and the interval passed
    assert checkpoints(flushed(j.flush(500))) == []  # no inputs since
    coordinator(j).context.request_checkpoint()
    assert [c.checkpoint_id for c in checkpoints(flushed(j.flush(510)))] == [2]
    assert [c.checkpoint_id for c in checkpoints(flushed(j.flush(520, force=True)))] == [3]


# --- failures --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cls, text",
    [
        (FailInHandle, "failed in handle_event_from_operator:\nTraceback"),
        (FailInStart, "failed in start:"),
        (FailInCheckpoint, "checkpoint 0 of the coordinator of 'op' failed:"),
        (FailInAsync, "failed the job:"),
        (FailInThen, "failed in then:"),
        (FailsTheJob, "failed the job:\nthe coordinator gave up: boom by fail_job"),
    ],
)
def test_a_coordinator_failure_fails_the_job_and_the_coordinator_is_not_called_again(cls: type, text: str) -> None:
    j = coordinators(user_vertex(cls))
    c = coordinator(j)
    deadline = time.monotonic() + 5
    out = flushed(j.flush(0))
    j.feed(to_coordinator("op", 0, "x"))
    while not out.failures and time.monotonic() < deadline:  # a thread's failure comes when it comes
        out = flushed(j.flush(0))
        time.sleep(0.001)
    assert len(out.failures) == 1, out
    assert text in out.failures[0]
    assert "boom" in out.failures[0] or "not JSON serializable" in out.failures[0]
    assert "coordinator of 'op'" in out.failures[0]
    calls = list(c.calls)
    for ev in (
        to_coordinator("op", 1, "y"),
        task_state("op", 0, 0, TaskState.RUNNING),
        task_state("op", 1, 0, TaskState.FAILED),
        restart("op", 1, 1),
        task_state("op", 2, 0, TaskState.FINISHED),
    ):
        j.feed(ev)
    again = flushed(j.flush(0, force=True))
    j.committed()
    assert c.calls == calls  # silenced
    assert again.failures == out.failures  # and the job stays failed
    assert not [ev for ev, _ in again.facts if isinstance(ev, CoordinatorCheckpointed)]


def test_a_coordinator_that_cannot_be_created_fails_the_job() -> None:
    def broken(ref: str) -> type:
        raise ImportError(f"no module for {ref}")

    j = JobCoordinators(JOB, [user_vertex(Echo)], {}, broken)
    j.start(0)
    j.feed(to_coordinator("op", 0, "x"))
    out = flushed(j.flush(0))
    assert out.facts == [] and len(out.failures) == 1
    assert "creating the coordinator of 'op' failed" in out.failures[0] and "no module for" in out.failures[0]


# --- the unbound context ---------------------------------------------------------------------------


def test_an_unbound_context_refuses_every_call_with_a_clear_message() -> None:
    ctx = CoordinatorContext(JOB, "op", 2)
    for call in (
        lambda: ctx.send_event(0, "x"),
        lambda: ctx.fail_job("x"),
        ctx.request_checkpoint,
        lambda: ctx.call_async(lambda: None),
    ):
        with pytest.raises(ContextNotBound) as info:
            call()
        message = str(info.value)
        assert "'op'" in message and JOB in message
        assert "before the JobManager leads" in message and "reset_to_checkpoint" in message and "__init__" in message
    assert ctx._take() == []


def test_sending_from_reset_to_checkpoint_raises_context_not_bound() -> None:
    SendsInReset.caught.clear()
    j = coordinators(user_vertex(SendsInReset), start=False)
    j.restore("op", 4, {"got": []})
    assert len(SendsInReset.caught) == 1 and isinstance(SendsInReset.caught[0], ContextNotBound)
    j.start(0)
    out = flushed(j.flush(0))
    assert out.facts == [] and len(out.failures) == 1
    assert "failed in reset_to_checkpoint" in out.failures[0] and "ContextNotBound" in out.failures[0]
    assert "used its context before the JobManager leads" in out.failures[0]
    assert coordinator(j).calls == [("reset", 4)]  # never started


def test_sending_from_init_raises_context_not_bound() -> None:
    j = coordinators(user_vertex(SendsInInit))
    out = flushed(j.flush(0))
    assert out.facts == [] and len(out.failures) == 1
    assert "creating the coordinator of 'op' failed" in out.failures[0]
    assert "ContextNotBound" in out.failures[0] and "used its context before the JobManager leads" in out.failures[0]


def test_a_context_is_unbound_again_after_close() -> None:
    j = coordinators(user_vertex(Echo))
    ctx = coordinator(j).context
    ctx.send_event(0, "fine")
    j.close()
    with pytest.raises(ContextNotBound, match="is closed: its job ended or this JobManager stopped leading"):
        ctx.send_event(0, "too late")


# --- concurrency -----------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [ChattyThread, ChattyAsync])
def test_a_coordinator_thread_sends_while_the_main_loop_checkpoints(cls: type) -> None:
    j = coordinators(user_vertex(cls, parallelism=2))
    c = coordinator(j)
    facts: list[Event] = []
    began = time.monotonic()
    now = 0
    while not c.done.is_set():
        assert time.monotonic() - began < 10, "the coordinator's thread did not finish"
        now += 1
        j.feed(to_coordinator("op", now % 2, now))
        out = flushed(j.flush(now, force=True))
        assert out.failures == []
        facts += [ev for ev, _ in out.facts]
        j.committed()
    out = flushed(j.flush(now + 1, force=True))
    facts += [ev for ev, _ in out.facts]
    j.close()

    released = {"thread": [], "main": []}
    since = 0
    interleaved = 0
    for ev in facts:
        if isinstance(ev, CoordinatorCheckpointed):
            # the recorded state covers exactly the events released up to it
            assert ev.state == {"thread": len(released["thread"]), "main": len(released["main"])}
            assert ev.released == since
            since = 0
            interleaved += 0 < ev.state["thread"] < Chatty.N
        else:
            assert isinstance(ev, OperatorEvent) and not ev.to_coordinator
            released[ev.body["by"]].append(ev.body["n"])
            assert ev.subtask == (0 if ev.body["by"] == "thread" else 1)
            since += 1
    assert isinstance(facts[-1], CoordinatorCheckpointed)
    assert released["thread"] == list(range(1, Chatty.N + 1))  # each once, in order
    assert released["main"] == list(range(1, c.answered + 1)) and c.answered == now
    assert interleaved >= 1  # the main loop did checkpoint while the thread was sending


# --- bugs ------------------------------------------------------------------------------------------


def test_a_then_callback_after_the_snapshot_is_not_released_with_it() -> None:
    j = coordinators(user_vertex(SlowWork, parallelism=2))
    j.flush(0)
    j.feed(to_coordinator("op", 1, "job"))
    out = flushed(j.flush(0, force=True))
    released = 0
    for ev, _ in out.facts:
        if isinstance(ev, CoordinatorCheckpointed):
            released += ev.released
            assert ev.state["sent"] == released, (ev.state, ev.released)
    j.close()


def test_a_recorded_checkpoint_state_does_not_change_afterwards() -> None:
    j = coordinators(user_vertex(LiveState, parallelism=2))
    c = coordinator(j)
    first = checkpoints(flushed(j.flush(0)))[0]
    assert first.state == {"sent": 0}
    c.send(1)
    second = checkpoints(flushed(j.flush(0)))[0]
    assert second.state == {"sent": 1} and second.released == 1
    c.send(0)  # the coordinator's thread goes on before the flush is committed
    assert (first.state, second.state) == ({"sent": 0}, {"sent": 1})


def test_after_takeover_a_send_goes_to_the_attempt_that_runs() -> None:
    v = user_vertex(DeterministicEcho, parallelism=2)
    log = Log(coordinators(v))
    log.step()
    log.step(task_state("op", 1, 0, TaskState.FAILED, "x"), restart("op", 1, 1), force=True)
    assert coordinator(log.j).context.current_attempt(1) == 1
    j2 = log.takeover(v)
    assert flushed(j2.flush(0)).failures == []
    j2.feed(to_coordinator("op", 0, "to the restarted subtask"))
    assert flushed(j2.flush(0)).facts == [
        (to_subtask("op", 1, {"echo": "to the restarted subtask", "from": 0}, 1), ("op", 1))
    ]


def test_a_deterministic_coordinator_that_sends_in_start_survives_a_takeover() -> None:
    v = user_vertex(Greeter, parallelism=2)
    log = Log(coordinators(v))
    first = log.step()
    assert sends(first) == [(to_subtask("op", 0, "hello"), ("op", 0))]
    log.step(to_coordinator("op", 0, "a"))
    j2 = log.takeover(v)
    out = flushed(j2.flush(0))
    assert out.failures == []
