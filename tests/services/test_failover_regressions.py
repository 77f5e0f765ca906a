"""Failover regressions (issue 9), each on the session's real redis-server, driving the real
JobManager and TaskManager through their step functions.

Bug 8 (sinks per attempt) is covered in tests/dataplane; bugs 1-3 also have store-level
tests in tests/store/contract.py. Here each bug is reproduced the way a cluster meets it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import structlog

from sluice.errors import RedisUnavailable
from sluice.events import (
    FIELD,
    AcknowledgeRegistration,
    CancelJob,
    DisconnectTaskManager,
    DisposeJob,
    Envelope,
    JobRegistered,
    JobStatus,
    JobWaitingForSlots,
    LeadershipGranted,
    NextInputSplit,
    OperatorEvent,
    RefuseRegistration,
    RequestNextInputSplit,
    SubmitJob,
    SubmitTask,
    TaskManagerHeartbeat,
    TaskManagerLost,
    TaskManagerRegistered,
    TaskOperationResult,
    TaskRestartScheduled,
    TaskState,
    UpdateTaskExecutionState,
    decode,
    encode,
)
from sluice.services.common.shell import configure_logging
from sluice.services.jobmanager import JobManager, Phase
from sluice.services.membership import MembershipConfig
from sluice.store import Deliverer, EventLog, current_leader
from sluice.store.backend import Delegating
from tests.services.failover_helpers import (
    HANDLED,
    ManualWorld,
    TinySlots,
    coordinated_running,
    events,
    jm,
    job_state,
    lead,
    pump,
    register_message,
    register_tm,
    report,
    source_graph,
    started,
    submit,
    submit_tasks,
    tm,
)


class Died(BaseException):
    """The process dies here: nothing after this point of its step runs (not an Exception,
    so no handler of the JobManager's catches it)."""


def pending(log: EventLog, stream: str, group: str = "jobmanager") -> int:
    state = log.backend.group_state(stream, group)
    return state.pending if state else 0


def dead_letters(log: EventLog, tag: str) -> list[dict[bytes, bytes]]:
    return [fields for _, fields in log.replay_raw(log.keys.dead(tag))]


# --- bug 1: two leaders delivering one long outbox deliver every entry once -------------------------------


class PauseAfterFirstRead(Delegating):
    """After its first read of ``outbox`` (with ``entries``: the first that returned some),
    ``then()`` runs before the read returns: the process pauses there while others go on."""

    def __init__(self, inner: Any, outbox: str, then: Any, *, entries: bool = False) -> None:
        super().__init__(inner)
        self.outbox, self.then, self.entries, self.paused = outbox, then, entries, False

    def xrange(self, stream: str, after: str | None, count: int) -> Any:
        result = self.inner.xrange(stream, after, count)
        if stream == self.outbox and not self.paused and (result or not self.entries):
            self.paused = True
            self.then()
        return result


@pytest.mark.timeout(30)
def test_bug1_a_deposed_leader_and_the_new_one_deliver_a_long_outbox_once(log: EventLog, tmp_path: Path) -> None:
    """Leader A deploys 700 tasks in one commit (700 SubmitTask in the job's outbox, more
    than one read batch of 500) and pauses right after its first read of the outbox. B
    takes over and, delivering the outbox, pauses after its first read that returned
    entries; A resumes and finishes its step (delivering what it can); then B resumes.
    Every SubmitTask lands in the TaskManager's inbox exactly once. Before the fix (the same
    interleaving of the old code) B held entries 1-500 while A delivered 501-700 and moved
    the target's mark past them; B's were then dropped and acknowledged: 200 of 700
    delivered, nothing pending, tasks DEPLOYING forever."""
    keys = log.keys
    outbox = keys.outbox(keys.job("j1"))
    a_read, a_go = threading.Event(), threading.Event()

    def a_pauses() -> None:
        a_read.set()
        assert a_go.wait(20), "B never let A go on"

    world_a = ManualWorld()
    a = jm(
        EventLog(PauseAfterFirstRead(log.backend, outbox, a_pauses), keys), world_a, "jm-a", tmp_path, lease_ttl_ms=300
    )  # it lapses while A is paused
    lead(a, world_a)
    log.append(keys.inbox(keys.cluster), register_message(world_a, "tm-1", slots=700, epoch=1))
    pump(
        [lambda: a.step(block_ms=None)],
        lambda: len(a.state.membership.active()) == 1,
        what="tm-1's registration",
        world=world_a,
        advance_ms=10,
    )
    submit(log, world_a, "j1", source_graph("j1", parallelism=700, splits=700, max_parallelism=1024))
    a_errors: list[BaseException] = []

    def run_a() -> None:
        try:
            while not a_go.is_set():  # until the step that paused has ended
                a.step(block_ms=None)
                world_a.advance(10)
        except BaseException as exc:  # noqa: BLE001 (reported by the main thread)
            a_errors.append(exc)

    thread_a = threading.Thread(target=run_a, daemon=True)
    thread_a.start()
    assert a_read.wait(20), "A never read its outbox"
    assert log.length(outbox) == 700 and submit_tasks(log, "tm-1") == []  # none delivered yet

    by_a: list[int] = []

    def b_pauses() -> None:  # A resumes (its lease lapsed meanwhile: it is deposed) and finishes its step
        a_go.set()
        thread_a.join(20)
        assert not thread_a.is_alive()
        by_a.append(len(submit_tasks(log, "tm-1")))

    world_b = ManualWorld()
    b = jm(
        EventLog(PauseAfterFirstRead(log.backend, outbox, b_pauses, entries=True), keys),
        world_b,
        "jm-b",
        tmp_path,
        lease_ttl_ms=300,
    )
    assert lead(b, world_b) == 2
    assert a_errors == [] and a.errors == [] and b.errors == []
    assert by_a == [700]  # A, resumed, delivered the whole outbox; B's batch, read before, added nothing

    sent = submit_tasks(log, "tm-1")
    assert len(sent) == 700
    assert Counter(s.execution_id for s in sent) == Counter({f"src:{i}:0": 1 for i in range(700)})
    assert Deliverer(log, keys.job("j1")).deliver() == 0  # nothing left to deliver
    assert len(submit_tasks(log, "tm-1")) == 700
    assert dead_letters(log, keys.job("j1")) == []


# --- bug 2: a new leader decides each pending entry once ------------------------------------------


class DieAtCommit(Delegating):
    """Once ``armed`` (a tag's fence key), raises Died instead of running the next commit
    script on that tag."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.armed: str | None = None
        self.died = False

    def script(self, name: str, keys: Any, args: Any) -> Any:
        if self.armed is not None and name == "commit" and keys[0].startswith(self.armed):
            self.armed, self.died = None, True
            raise Died(f"died before committing to {keys[0]}")
        return super().script(name, keys, args)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("dies_at", ["cluster", "job"])
def test_bug2_a_new_leader_decides_what_the_dead_leader_read_exactly_once(
    log: EventLog, tmp_path: Path, dies_at: str
) -> None:
    """Leader A reads a batch holding cluster-inbox entries (a registration, a submission)
    and job-inbox entries (two unnumbered split requests, two operator events for a user
    coordinator) and dies before its commit (the cluster's, or the job's after its
    coordinator ran). Leader B takes over: one request fact and one split per request, one
    fact per operator event, its coordinator's handler called once per event, each cluster
    entry decided once. Before the fix B got every job entry twice (reclaimed, then again as
    its own pending) in one group commit: 4 request facts and all 4 splits for 2 requests,
    its coordinator's handler called twice per event."""
    HANDLED.clear()
    keys = log.keys
    world = ManualWorld()
    dying = DieAtCommit(log.backend)
    a, _, src, agg = coordinated_running(
        log, world, tmp_path, jm_log=EventLog(dying, keys)
    )  # a 300 ms lease: B waits for it
    job_inbox, cluster_inbox = keys.inbox(keys.job("j1")), keys.inbox(keys.cluster)
    facts = keys.facts(keys.job("j1"))
    before = log.last_id(facts)
    assert pending(log, job_inbox) == 0 and pending(log, cluster_inbox) == 0

    def to_job(ev: Any) -> None:
        log.append(job_inbox, Envelope(ev, world.new_id(), 0, world.now_ms(), "j1"))

    for _ in range(2):  # unnumbered (seq 0): only reading each entry once keeps them apart
        to_job(RequestNextInputSplit("j1", "src", 0, src["execution_id"], "host-a"))
    for hello in ("h1", "h2"):
        to_job(OperatorEvent("j1", "agg", 0, True, {"hello": hello}, agg["attempt"]))
    log.append(cluster_inbox, register_message(world, "tm-2", epoch=1))
    submit(log, world, "j2", source_graph("j2"))

    dying.armed = keys.fence(keys.cluster if dies_at == "cluster" else keys.job("j1"))
    with pytest.raises(Died):
        a.step(block_ms=None)
    assert dying.died
    assert pending(log, job_inbox) == 4
    assert pending(log, cluster_inbox) == (2 if dies_at == "cluster" else 0)
    a_coordinator = id(a.state.coords["j1"].holders["agg"].coordinator)

    b = jm(log, world, "jm-b", tmp_path, lease_ttl_ms=300)
    assert lead(b, world) == 2
    for _ in range(3):
        world.advance(300)
        b.step(block_ms=None)
    assert b.errors == []

    new = [env for _, env in log.replay(facts, before)]
    requests = [e.event for e in new if isinstance(e.event, RequestNextInputSplit)]
    answers = [e.event for e in new if isinstance(e.event, NextInputSplit)]
    assert len(requests) == 2 and {e.epoch for e in new if isinstance(e.event, RequestNextInputSplit)} == {2}
    assert len(answers) == 2 and None not in [x.split for x in answers]
    assert len({x.split["index"] for x in answers}) == 2  # two different splits, each once
    task_inbox = keys.task_inbox(keys.job("j1"), "src", 0)
    assert len(events(log, task_inbox, NextInputSplit)) == 2
    hellos = [e.event.body["hello"] for e in new if isinstance(e.event, OperatorEvent) and e.event.to_coordinator]
    assert sorted(hellos) == ["h1", "h2"]
    b_coordinator = id(b.state.coords["j1"].holders["agg"].coordinator)
    by_instance = Counter((who, ev["hello"]) for who, _, _, ev in HANDLED)
    assert by_instance[(b_coordinator, "h1")] == 1 and by_instance[(b_coordinator, "h2")] == 1
    if dies_at == "job":  # A's coordinator ran its handler once per event too, before A died
        assert by_instance[(a_coordinator, "h1")] == 1 and by_instance[(a_coordinator, "h2")] == 1
    # The cluster entries: decided once, by A before it died at the job's commit, or by B.
    cluster_facts = keys.facts(keys.cluster)
    registered = [f for f in events(log, cluster_facts, TaskManagerRegistered) if f.resource_id == "tm-2"]
    replies = events(log, keys.inbox(keys.taskmanager("tm-2")), (AcknowledgeRegistration, RefuseRegistration))
    assert len(replies) == 1
    if dies_at == "job":
        assert len(registered) == 1 and isinstance(replies[0], AcknowledgeRegistration)
    else:  # addressed to epoch 1, decided by the leader of epoch 2: refused (retry), once
        assert registered == [] and isinstance(replies[0], RefuseRegistration) and replies[0].retry
    assert [f.job_id for f in events(log, cluster_facts, JobRegistered)] == ["j1", "j2"]
    assert len(events(log, keys.inbox(keys.job("j2")), SubmitJob)) == 1
    assert pending(log, job_inbox) == 0 and pending(log, cluster_inbox) == 0


# --- bug 3: a bad reply address is parked; the leader goes on --------------------------------------


@pytest.mark.timeout(30)
def test_bug3_bad_reply_addresses_are_parked_and_leaders_go_on_answering(log: EventLog, tmp_path: Path) -> None:
    """SubmitJob and DisposeJob whose reply_to has no hash tag (refused by the core) are
    parked in the cluster's dead letters with the reason; the replies to an inbox whose key
    holds a hash are delivered once the hash is moved aside (they were parked, until the
    simulation showed a parked SubmitJob left its job never begun); leadership is granted
    once per epoch, and registrations are answered, by this leader and the next. Before the fix delivery raised after the reply
    was committed and every rebuild raised again (measured: 28-31 LeadershipGranted in 10 s
    for a refusal or a DisposeJob sent to 'no-tag-at-all', 3-4 for a hash, each with a rich
    traceback; a registration sent after it was never answered)."""
    keys = log.keys
    world = ManualWorld()
    a = jm(log, world, "jm-a", tmp_path)
    assert lead(a, world) == 1
    cluster_inbox = keys.inbox(keys.cluster)
    a_hash = keys.inbox(keys.client("hashed"))
    log.backend.hset(a_hash, {"not": b"a stream"})
    missing_code = "0" * 64  # refused (no code), so the refusal is what goes to the hash
    submit(log, world, "j-notag", source_graph("j-notag"), reply_to="no-tag-at-all")
    submit(log, world, "j-hash", source_graph("j-hash"), reply_to=a_hash, code_blob=missing_code)
    for job_id, reply_to in (("j-notag", "no-tag-at-all"), ("nope", a_hash)):
        log.append(cluster_inbox, Envelope(DisposeJob(job_id, reply_to), world.new_id(), 0, world.now_ms()))
    log.append(cluster_inbox, register_message(world, "tm-1", epoch=1))
    pump(
        [lambda: a.step(block_ms=None)],
        lambda: bool(events(log, keys.inbox(keys.taskmanager("tm-1")))),
        what="tm-1's registration answered",
        world=world,
        advance_ms=100,
    )
    for _ in range(10):  # and it stays so
        a.step(block_ms=None)
        world.advance(100)
    assert a.errors == [] and a.leading and a.epoch == 1

    dead = dead_letters(log, keys.cluster)
    assert len(dead) == 2 and all(d[b"kind"] == b"rejected" for d in dead)
    assert sorted(decode(d[b"field:e"]).type for d in dead) == ["DisposeJob", "SubmitJob"]
    for d in dead:
        assert d[b"stream"] == cluster_inbox.encode()
        assert b"'no-tag-at-all' is not an inbox of this cluster" in d[b"reason"]
    assert [type(e).__name__ for e in events(log, a_hash)] == ["JobRefused", "JobRefused"]
    client = log.backend.client  # type: ignore[attr-defined]
    (aside,) = [k for k in client.keys("*") if k.decode().startswith(a_hash + ":not-a-stream:")]
    cluster_facts = keys.facts(keys.cluster)
    assert [g.epoch for g in events(log, cluster_facts, LeadershipGranted)] == [1]
    assert events(log, cluster_facts, JobRegistered) == []
    assert [r.session for r in events(log, keys.inbox(keys.taskmanager("tm-1")), AcknowledgeRegistration)] == ["s1"]
    assert log.backend.hgetall(aside.decode()) == {b"not": b"a stream"}  # kept for a person to look at

    # The next leader delivers the same outbox on taking over: nothing raises, nothing is parked twice.
    a.step_down()
    a.lease.release()
    b = jm(log, world, "jm-b", tmp_path)
    assert lead(b, world) == 2
    log.append(cluster_inbox, register_message(world, "tm-2", epoch=2))
    pump(
        [lambda: b.step(block_ms=None)],
        lambda: bool(events(log, keys.inbox(keys.taskmanager("tm-2")))),
        what="tm-2's registration answered",
        world=world,
        advance_ms=100,
    )
    assert b.errors == [] and b.leading
    assert [g.epoch for g in events(log, cluster_facts, LeadershipGranted)] == [1, 2]
    assert len(events(log, keys.inbox(keys.taskmanager("tm-2")), AcknowledgeRegistration)) == 1
    assert len(dead_letters(log, keys.cluster)) == 2 and len(events(log, a_hash)) == 2


# --- bug 4: hostile resource ids are parked, never a rebuild ----------------------------------------


HOSTILE_IDS = ["}", "{", "*", "\n", "x" * 100_000]


@pytest.mark.timeout(30)
def test_bug4_hostile_resource_ids_are_parked_with_the_reason_and_never_force_a_rebuild(
    log: EventLog, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """RegisterTaskManager with a resource id that cannot be part of a key: each is parked
    with a reason naming the id's problem, the leader does not rebuild (one LeadershipGranted
    at its epoch), a good registration is answered, and what the JobManager logs stays
    short (no traceback, no 100,000-character line). Before the fix the handler raised, the
    leader rebuilt from the log and granted itself leadership again at the same epoch
    (measured: two LeadershipGranted at epoch 1 per hostile id), logging a 300-line
    traceback with locals (1,572 lines, the longest 100,306 characters, for the long id)."""
    keys = log.keys
    saved = structlog.get_config()
    configure_logging("DEBUG", json=False)  # the real renderer, to the captured stderr
    try:
        world = ManualWorld()
        a = jm(log, world, "jm-a", tmp_path)
        assert lead(a, world) == 1
        cluster_inbox = keys.inbox(keys.cluster)
        for rid in HOSTILE_IDS:
            log.append(cluster_inbox, register_message(world, rid, epoch=1))
        log.append(cluster_inbox, Envelope(TaskManagerHeartbeat("}", "s1", 1, 0), world.new_id(), 0, world.now_ms()))
        log.append(cluster_inbox, register_message(world, "tm-1", epoch=1))
        pump(
            [lambda: a.step(block_ms=None)],
            lambda: bool(events(log, keys.inbox(keys.taskmanager("tm-1")))),
            what="tm-1's registration answered",
            world=world,
            advance_ms=100,
        )
        for _ in range(10):
            a.step(block_ms=None)
            world.advance(100)
        output = capsys.readouterr()
    finally:
        structlog.configure(**saved)
    assert a.errors == [] and a.leading and a.epoch == 1
    dead = dead_letters(log, keys.cluster)
    assert len(dead) == len(HOSTILE_IDS) + 1
    parked_ids = []
    for d in dead:
        msg = decode(d[b"field:e"]).event
        parked_ids.append(msg.resource_id)
        assert d[b"kind"] == b"rejected" and d[b"stream"] == cluster_inbox.encode()
        reason = d[b"reason"].decode()
        assert f"{msg.TYPE}'s resource id" in reason and "is not usable in a key" in reason
        assert "Traceback" not in reason and len(reason) < 500
    assert parked_ids == [*HOSTILE_IDS, "}"]
    cluster_facts = keys.facts(keys.cluster)
    assert [g.epoch for g in events(log, cluster_facts, LeadershipGranted)] == [1]
    assert [f.resource_id for f in events(log, cluster_facts, TaskManagerRegistered)] == ["tm-1"]
    assert len(events(log, keys.inbox(keys.taskmanager("tm-1")), AcknowledgeRegistration)) == 1
    lines = (output.out + output.err).splitlines()
    assert sum("entry parked in dead letters" in line for line in lines) == len(HOSTILE_IDS) + 1
    assert "Traceback" not in output.out + output.err
    assert max(len(line) for line in lines) < 1000, max(lines, key=len)[:200]


# --- bug 5: a TaskManager handles a SubmitTask once, whatever its acknowledgement did ---------------


class AckFailsOnce(Delegating):
    """The round trip that acknowledges entry ``target`` (an XACK, or the next read that
    carries it) raises RedisUnavailable once: before it reached the server, or after it
    took effect (the reply was lost)."""

    def __init__(self, inner: Any, when: str) -> None:
        super().__init__(inner)
        self.when, self.target, self.failed = when, "", False

    def _fail(self, ids: Any, call: Any) -> None:
        if self.target in ids and not self.failed:
            self.failed = True
            if self.when == "after":
                call()
            raise RedisUnavailable(f"(injected) connection lost acknowledging {self.target}")

    def xack(self, stream: str, group: str, ids: Any) -> int:
        self._fail(ids, lambda: self.inner.xack(stream, group, ids))
        return self.inner.xack(stream, group, ids)

    def xreadgroup(
        self, group: str, consumer: str, streams: Any, *, count: int, block_ms: int | None, ack: Any = None
    ) -> Any:
        def call() -> Any:
            return self.inner.xreadgroup(group, consumer, streams, count=count, block_ms=block_ms, ack=ack)

        self._fail([i for ids in (ack or {}).values() for i in ids], call)
        return call()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("when", ["before", "after"])
def test_bug5_a_failed_acknowledgement_does_not_start_a_task_twice(log: EventLog, tmp_path: Path, when: str) -> None:
    """The TaskManager's acknowledgement of a SubmitTask (sent with its next read) fails
    with a Redis error, before or after it took effect. The next step reads its pending
    entries again and finds the attempt
    already here: one TaskOperationResult(success=True), no failure report, one launch, and
    the leader counts no restart. Before the fix (acknowledgement lost before it took
    effect) it started the task again, the task table refused (slot busy), it reported
    failure, and the leader failed the running attempt; each restart went to the same busy
    slot: 1 success, 4 failures, the job FAILED after its 3 restarts. (Lost after it took
    effect, the old code also handled it once: that case guards the fix.)"""
    keys = log.keys
    world = ManualWorld()
    a = jm(log, world, "jm-a", tmp_path)
    lead(a, world)
    faulty = AckFailsOnce(log.backend, when)
    slots = TinySlots()
    t = tm(EventLog(faulty, keys), world, tmp_path, slots, n=1)
    register_tm(a, t, world)
    submit(log, world, "j1", source_graph("j1"))
    inbox = keys.inbox(keys.taskmanager("tm-1"))
    pump(
        [lambda: a.step(block_ms=None)],
        lambda: bool(events(log, inbox, SubmitTask)),
        what="the SubmitTask",
        world=world,
        advance_ms=10,
    )
    ((faulty.target, _),) = [(i, e) for i, e in log.replay(inbox) if isinstance(e.event, SubmitTask)]
    t.step(block_ms=None)  # handles it; the acknowledgement goes with the next read
    assert len(slots.launched) == 1 and not faulty.failed
    with pytest.raises(RedisUnavailable):
        t.step(block_ms=None)
    assert faulty.failed and len(slots.launched) == 1
    assert pending(log, inbox, "taskmanager") == (1 if when == "before" else 0)
    for _ in range(5):  # the loop goes on after the error (run() waits a moment, then steps again)
        t.step(block_ms=None)
        a.step(block_ms=None)
        world.advance(50)
    assert pending(log, inbox, "taskmanager") == 0
    job_inbox = keys.inbox(keys.job("j1"))
    results = events(log, job_inbox, TaskOperationResult)
    assert [r.success for r in results] == [True]
    assert [u.state for u in events(log, job_inbox, UpdateTaskExecutionState)] == [TaskState.INITIALIZING]
    assert len(slots.launched) == 1 and len(t.tasks) == 1
    job = job_state(log, "j1")
    ex = job.vertices["src"].subtasks[0]
    assert (ex.attempt, ex.state, job.restarts) == (0, TaskState.INITIALIZING, 0)
    assert events(log, keys.facts(keys.job("j1")), TaskRestartScheduled) == []


class EagerWorker(TinySlots):
    """An idle worker: it takes the task the moment it is queued (right after the launch's
    reports, as ProcessSlots's transaction orders them) and reports RUNNING before the
    TaskManager's launch step returns."""

    def __init__(self, log: EventLog, world: Any) -> None:
        super().__init__(log)
        self.world = world

    def launch(
        self,
        slot: int,
        descriptor: dict,
        runtime: dict,
        *,
        task_id: str,
        handle: str,
        reports: Sequence[tuple[str, Envelope]] = (),
    ) -> str:
        handle = super().launch(slot, descriptor, runtime, task_id=task_id, handle=handle, reports=reports)
        assert self.log is not None
        report(self.log, self.world, descriptor, "tm-1", slot, TaskState.RUNNING)
        return handle


@pytest.mark.timeout(30)
def test_an_idle_worker_reporting_running_at_once_does_not_overtake_initializing(log: EventLog, tmp_path: Path) -> None:
    """The TaskManager's INITIALIZING is in the job's inbox before the task is queued, so a
    worker that reports RUNNING at once comes after it and the log has every state in order.
    (When INITIALIZING was only queued until the end of the start, the leader, already at
    RUNNING, dropped it: the e2e word count saw SCHEDULED, DEPLOYING, RUNNING, FINISHED.)"""
    keys = log.keys
    world = ManualWorld()
    a = jm(log, world, "jm-a", tmp_path)
    lead(a, world)
    slots = EagerWorker(log, world)
    t = tm(log, world, tmp_path, slots, n=1)
    register_tm(a, t, world)
    submit(log, world, "j1", source_graph("j1"))
    pump(
        [lambda: a.step(block_ms=None), lambda: t.step(block_ms=None)],
        lambda: bool(slots.launched),
        what="the launch",
        world=world,
        advance_ms=10,
    )
    pump(
        [lambda: a.step(block_ms=None)],
        lambda: job_state(log, "j1").vertices["src"].subtasks[0].state == TaskState.RUNNING,
        what="RUNNING",
        world=world,
        advance_ms=10,
    )
    job_inbox = keys.inbox(keys.job("j1"))
    assert [u.state for u in events(log, job_inbox, UpdateTaskExecutionState)] == [
        TaskState.INITIALIZING,
        TaskState.RUNNING,
    ]
    facts = [f.state for f in events(log, keys.facts(keys.job("j1")), UpdateTaskExecutionState)]
    assert facts == [TaskState.SCHEDULED, TaskState.DEPLOYING, TaskState.INITIALIZING, TaskState.RUNNING]


class ReplyLostOnce(TinySlots):
    """Workers whose first launch takes effect (the task and its reports are in) but whose
    reply is lost: the TaskManager sees RedisUnavailable and cannot tell."""

    def __init__(self, log: EventLog, *, effect: bool) -> None:
        super().__init__(log)
        self.effect, self.failed, self.lost = effect, False, ""
        self.asked: list[str] = []

    def launch(
        self,
        slot: int,
        descriptor: dict,
        runtime: dict,
        *,
        task_id: str,
        handle: str,
        reports: Sequence[tuple[str, Envelope]] = (),
    ) -> str:
        if not self.failed:
            self.failed, self.lost = True, handle
            if self.effect:
                super().launch(slot, descriptor, runtime, task_id=task_id, handle=handle, reports=reports)
            raise RedisUnavailable("(test) connection lost around EXEC")
        return super().launch(slot, descriptor, runtime, task_id=task_id, handle=handle, reports=reports)

    def handed_over(self, handle: str) -> bool:
        self.asked.append(handle)
        return super().handed_over(handle)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("effect", [True, False], ids=["it-took-effect", "it-did-not"])
def test_a_launch_whose_reply_was_lost_is_not_handed_over_twice(log: EventLog, tmp_path: Path, effect: bool) -> None:
    """The hand-over and its reports are one transaction; when the connection drops around
    EXEC the TaskManager cannot tell whether it took effect. The start stands (undoing it
    deleted the temp files of a task the worker may be running), and once Redis answers
    it asks: one that took effect is kept (handing the attempt over again ran it twice,
    found by the simulation), one that did not is handed over again, reports and all."""
    keys = log.keys
    world = ManualWorld()
    a = jm(log, world, "jm-a", tmp_path)
    lead(a, world)
    slots = ReplyLostOnce(log, effect=effect)
    t = tm(log, world, tmp_path, slots, n=1)
    register_tm(a, t, world)
    submit(log, world, "j1", source_graph("j1"))
    pump(
        [lambda: a.step(block_ms=None), lambda: t.step(block_ms=None)],
        lambda: slots.failed and bool(t.tasks) and bool(slots.asked),
        what="the hand-over, settled",
        world=world,
        advance_ms=10,
    )
    assert slots.asked == [slots.lost] and not t.launches.unsure
    assert len(slots.launched) == 1  # once, whichever way the first try went
    (task,) = t.tasks.values()
    assert (slots.launched[0][2] == slots.lost) == effect and task.rq_job == slots.launched[0][2]
    assert task.temp_dir is not None and task.temp_dir.exists()  # nothing undone under the worker
    pump(
        [lambda: a.step(block_ms=None), lambda: t.step(block_ms=None)],
        lambda: job_state(log, "j1").vertices["src"].subtasks[0].state == TaskState.INITIALIZING,
        what="INITIALIZING",
        world=world,
        advance_ms=10,
    )
    job_inbox = keys.inbox(keys.job("j1"))
    assert [r.success for r in events(log, job_inbox, TaskOperationResult)] == [True]
    assert job_state(log, "j1").restarts == 0


class LeaderActsAfterEachWrite(Delegating):
    """A worker's connection after whose every append the leader steps at once (as a leader
    waiting in XREADGROUP does): whatever it decides lands between two of the worker's writes."""

    def __init__(self, inner: Any, leader_step: Any) -> None:
        super().__init__(inner)
        self.leader_step = leader_step

    def around(self, name: str, call: Any) -> Any:
        out = call()
        if name in ("xadd", "xadd_many"):
            self.leader_step()
        return out


@pytest.mark.timeout(30)
def test_a_finished_tasks_slot_given_to_the_next_attempt_at_once_does_not_kill_its_worker(
    log: EventLog, tmp_path: Path
) -> None:
    """One slot, two subtasks: the worker's FINISHED frees the slot and the leader sends the
    next subtask's SubmitTask to it straight away. The TaskManager must read the FINISHED
    first (the worker writes it to the TaskManager's inbox before the job's), so it frees
    the slot and launches the next task in the same worker. (With the job's inbox written
    first, the SubmitTask overtook the FINISHED: the TaskManager found the slot busy and
    killed the worker, warm Spark session and all.)"""
    world, a, t, slots = started(log, tmp_path, n=1)
    submit(log, world, "j1", source_graph("j1", parallelism=2))
    pump(
        [lambda: a.step(block_ms=None), lambda: t.step(block_ms=None)],
        lambda: len(slots.launched) == 1,
        what="the first launch",
        world=world,
        advance_ms=10,
    )
    worker = EventLog(LeaderActsAfterEachWrite(log.backend, lambda: a.step(block_ms=None)), log.keys)
    ((slot, d, _),) = slots.launched
    report(worker, world, d, "tm-1", slot, TaskState.RUNNING)
    report(worker, world, d, "tm-1", slot, TaskState.FINISHED)
    pump(
        [lambda: t.step(block_ms=None), lambda: a.step(block_ms=None)],
        lambda: len(slots.launched) == 2,
        what="the second launch",
        world=world,
        advance_ms=10,
    )
    assert slots.killed == []
    assert [launched[1]["subtask"] for launched in slots.launched] == [0, 1]


# --- bug 6: a replay longer than the stall limit still ends in leadership -----------------------------


def write_history(log: EventLog, job_id: str, n: int) -> None:
    """``n`` facts in the job's stream, written by the server itself (a loop of XADDs in one
    script per 50,000: a pipeline from Python takes seconds for 300,000). They are facts the
    replay folds and then forgets (the job waiting for slots): facts it keeps in memory
    until the end, such as a coordinator's events, make the replay's garbage collections
    long enough (0.25 s here for 150,000, over 1 s on a loaded machine) to look like a stall
    of a step by themselves."""
    stream = log.keys.facts(log.keys.job(job_id))
    data = encode(Envelope(JobWaitingForSlots(job_id, 1, 0), "f" * 32, 1, 1_700_000_000_000, job_id))
    for start in range(0, n, 50_000):
        log.client.eval(
            "for i = 1, tonumber(ARGV[2]) do redis.call('XADD', KEYS[1], '*', ARGV[3], ARGV[1]) end",
            1,
            stream,
            data,
            min(50_000, n - start),
            FIELD,
        )


def long_history(log: EventLog, world: ManualWorld, tmp_path: Path, n: int) -> None:
    """A log whose replay is long: a job (cancelled since) with ``n`` facts, written by a
    leader that then steps down and lets its lease go."""
    keys = log.keys
    a = jm(log, world, "jm-a", tmp_path)
    lead(a, world)
    submit(log, world, "j1", source_graph("j1"))  # no TaskManager: it waits for slots
    pump([lambda: a.step(block_ms=None)], lambda: "j1" in a.state.jobs.jobs, what="the job", world=world, advance_ms=10)
    write_history(log, "j1", n)
    log.append(keys.inbox(keys.job("j1")), Envelope(CancelJob("j1", "done"), world.new_id(), 0, world.now_ms(), "j1"))
    pump(
        [lambda: a.step(block_ms=None)],
        lambda: a.state.jobs.jobs["j1"].status == JobStatus.CANCELED,
        what="the job cancelled",
        world=world,
        advance_ms=10,
    )
    a.step_down()
    a.lease.release()
    assert log.length(keys.facts(keys.job("j1"))) > n


class SlowPages(Delegating):
    """Every page read from the log takes ``ms`` of the world's time."""

    def __init__(self, inner: Any, world: ManualWorld, ms: int) -> None:
        super().__init__(inner)
        self.world, self.ms = world, ms

    def xrange(self, stream: str, after: str | None, count: int) -> Any:
        self.world.advance(self.ms)
        return self.inner.xrange(stream, after, count)


@pytest.mark.timeout(30)
def test_bug6_a_replay_longer_than_the_stall_limit_ends_in_one_leadership(log: EventLog, tmp_path: Path) -> None:
    """On the test's clock each page of the replay takes 100 ms, and the replay (80 pages of
    250 facts) takes 8 s; the stall limit is 1 s. With lease renewals between the steps, the
    JobManager becomes leader once (one LeadershipGranted) and keeps leading: every page is
    progress, before it serves (after 1 s) and while it serves and rebuilds the rest. Before the fix the whole replay was one stall, the watchdog let the lease
    lapse, and the JobManager took over again and again (the old code, with the next
    test's numbers: 3 takeovers in 10 s, epochs 2-4, each stepping down again)."""
    keys = log.keys
    world = ManualWorld()
    long_history(log, world, tmp_path, 20_000)
    b = JobManager(
        EventLog(SlowPages(log.backend, world, 100), keys),
        world=world,
        jm_id="jm-b",
        lease_ttl_ms=3000,
        max_stall_s=1.0,
        replay_page=250,
        storage_root=f"file://{tmp_path}/storage",
    )
    began = world.monotonic()
    for _ in range(1_000):
        b.step(block_ms=None)
        b.step_lease()  # the renewal thread's turn, between any two steps
        if b.leading and b.replay is None:  # (it serves after 1 s, and rebuilds the job while it serves)
            break
    assert b.leading and b.epoch == 2 and not b.recovering
    assert world.monotonic() - began > 5 * b.lease.max_stall_s  # the replay was long on this clock
    for _ in range(5):
        world.advance(300)
        b.step(block_ms=None)
        assert b.step_lease() and b.leading and not b.lease.lost
    assert b.errors == []
    assert [(g.epoch, g.leader_id) for g in events(log, keys.facts(keys.cluster), LeadershipGranted)] == [
        (1, "jm-a"),
        (2, "jm-b"),
    ]


@pytest.mark.timeout(60)
def test_bug6_the_real_loop_and_renewal_thread_lead_once_after_a_long_replay(log: EventLog, tmp_path: Path) -> None:
    """The same with the JobManager's real loop and renewal thread on the real clock: a stall
    limit of 0.4 s (renewal every 0.25 s) and 400,000 facts to replay (1.5-2 s here). It
    becomes leader once and keeps leading; the renewal thread looked during the replay after
    the stall limit had passed since it began (where the old code saw a stall)."""
    keys = log.keys
    long_history(log, ManualWorld(), tmp_path, 400_000)
    b = JobManager(
        log, jm_id="jm-b", lease_ttl_ms=750, max_stall_s=0.4, replay_page=250, storage_root=f"file://{tmp_path}/storage"
    )
    looked: list[tuple[float, str]] = []
    renew = b.step_lease

    def watched() -> bool:
        looked.append((time.monotonic(), b.phase))
        return renew()

    b.step_lease = watched  # type: ignore[method-assign]
    stop = threading.Event()
    thread = threading.Thread(target=b.run, args=(stop,), daemon=True)
    began = time.monotonic()
    thread.start()
    try:
        deadline = began + 40
        while not b.leading and time.monotonic() < deadline:
            time.sleep(0.02)
        assert b.leading, "jm-b never finished becoming leader"
        # The watchdog looked during the replay after the stall limit had passed since it began.
        assert any(phase is Phase.REPLAYING and at - began > b.lease.max_stall_s for at, phase in looked), (
            f"the replay took {time.monotonic() - began:.2f} s: too short to show anything"
        )
        time.sleep(0.6)  # renewals go on: it keeps leading
        assert b.leading and b.epoch == 2 and b.errors == []
        holder = current_leader(log)
        assert holder is not None and (holder.holder, holder.epoch) == ("jm-b", 2)
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()
    assert [(g.epoch, g.leader_id) for g in events(log, keys.facts(keys.cluster), LeadershipGranted)] == [
        (1, "jm-a"),
        (2, "jm-b"),
    ]


# --- bug 7: heartbeats in a backlog are heard before anyone is declared lost ----------------------------


@pytest.mark.timeout(30)
def test_bug7_after_a_stall_heartbeats_in_a_long_backlog_keep_a_live_taskmanager(log: EventLog, tmp_path: Path) -> None:
    """The leader's main loop stalls for 5 s (heartbeat timeout 1 s). Meanwhile 1,200
    heartbeats of tm-1 pile up in the cluster inbox, more than two read batches (500), and
    behind them one of tm-2, also alive. Nobody is declared lost until the leader has read
    the inbox to its end; then the TaskManager that said nothing (tm-3) is lost, and tm-1
    and tm-2 are not. Before the fix timeouts were decided after the first batch, which
    held only tm-1's heartbeats: tm-2 was declared lost (and told to register again)."""
    keys = log.keys
    world = ManualWorld()
    a = jm(log, world, "jm-a", tmp_path, config=MembershipConfig(100, 1000), batch=500)
    lead(a, world)
    cluster_inbox = keys.inbox(keys.cluster)
    for rid in ("tm-1", "tm-2", "tm-3"):
        log.append(cluster_inbox, register_message(world, rid, epoch=1))
    pump(
        [lambda: a.step(block_ms=None)],
        lambda: len(a.state.membership.active()) == 3,
        what="three registrations",
        world=world,
        advance_ms=10,
    )
    world.advance(5_000)  # the stall: nothing read for 5 s

    def beat(rid: str) -> Envelope:
        return Envelope(TaskManagerHeartbeat(rid, "s1", 1, 1), world.new_id(), 0, world.now_ms())

    log.append_batch(cluster_inbox, [beat("tm-1") for _ in range(1_200)] + [beat("tm-2")])
    reads = 0
    while a.consumer.read_counts.get(cluster_inbox, 0) == 500 or reads == 0:
        a.step(block_ms=None)
        reads += 1
        lost = [f.resource_id for f in events(log, keys.facts(keys.cluster), TaskManagerLost)]
        assert lost == [], f"{lost} declared lost after {reads} reads of the backlog"
        assert reads < 10
    assert reads == 3 and pending(log, cluster_inbox) == 0  # 500 + 500 + 201, each decided
    for _ in range(3):
        world.advance(300)
        a.step(block_ms=None)
    lost = [f.resource_id for f in events(log, keys.facts(keys.cluster), TaskManagerLost)]
    assert lost == ["tm-3"]  # timeouts still work: the TaskManager that said nothing is lost
    assert sorted(r.resource_id for r in a.state.membership.active()) == ["tm-1", "tm-2"]
    for rid in ("tm-1", "tm-2"):
        assert events(log, keys.inbox(keys.taskmanager(rid)), DisconnectTaskManager) == []
    assert a.errors == []


# --- found by the simulation: a Redis error while reporting one dead worker loses the next ------------


class JobReportFailsOnce(Delegating):
    """The first append to ``stream`` once ``armed`` raises RedisUnavailable before it reaches
    the server (a dropped connection)."""

    def __init__(self, inner: Any, stream: str) -> None:
        super().__init__(inner)
        self.stream, self.armed, self.failed = stream, False, False

    def xadd(self, stream: str, fields: Any, *, maxlen: int | None = None) -> str:
        if self.armed and not self.failed and stream == self.stream:
            self.failed = True
            raise RedisUnavailable(f"(injected) connection lost appending to {stream}")
        return self.inner.xadd(stream, fields, maxlen=maxlen)

    def xadd_many(self, items: Any) -> list[str]:  # the TaskManager sends its owed reports in one round trip
        if self.armed and not self.failed and any(stream == self.stream for stream, _ in items):
            self.failed = True
            raise RedisUnavailable(f"(injected) connection lost appending to {self.stream}")
        return self.inner.xadd_many(items)


@pytest.mark.timeout(30)
def test_every_dead_worker_is_reported_though_redis_fails_while_reporting(log: EventLog, tmp_path: Path) -> None:
    """Both workers of a TaskManager die in one pass (the leader cancelled the job, or the
    host ran out of memory). Reporting the first fails with a Redis error. Each worker's
    exit is seen once, so both must still be reported and both slots freed. Seed 201358 of
    `scripts/simulate --all-faults` found this: the old code sent each report at once, the
    error ended the pass, and the second exit was lost for good: its task stayed CANCELING,
    its slot busy, and the job never left FAILING."""
    keys = log.keys
    world = ManualWorld()
    a = jm(log, world, "jm-a", tmp_path)
    lead(a, world)
    job_inbox = keys.inbox(keys.job("j1"))
    faulty = JobReportFailsOnce(log.backend, job_inbox)
    slots = TinySlots()
    t = tm(EventLog(faulty, keys), world, tmp_path, slots, n=2)
    register_tm(a, t, world)
    submit(log, world, "j1", source_graph("j1", parallelism=2))
    pump(
        [lambda: a.step(block_ms=None), lambda: t.step(block_ms=None)],
        lambda: len(t.tasks) == 2,
        what="two tasks on the TaskManager",
        world=world,
        advance_ms=10,
    )
    slots._exited += [(0, "signal 9"), (1, "signal 9")]
    faulty.armed = True
    with pytest.raises(RedisUnavailable):
        t.step(block_ms=None)
    assert faulty.failed
    for _ in range(3):
        t.step(block_ms=None)
    failed = [u for u in events(log, job_inbox, UpdateTaskExecutionState) if u.state == TaskState.FAILED]
    assert sorted(u.subtask for u in failed) == [0, 1]
    assert len(t.tasks) == 0  # both slots free again
    pump(
        [lambda: a.step(block_ms=None), lambda: t.step(block_ms=None)],
        lambda: job_state(log, "j1").restarts == 2,
        what="both subtasks restarted",
        world=world,
        advance_ms=10,
    )


@pytest.mark.timeout(30)
def test_a_dropped_attempt_is_killed_then_its_sink_subtask_swept(log: EventLog, tmp_path: Path) -> None:
    """A TaskManager told it was declared lost kills its attempts. One may have died halfway
    through publishing its sink, after its replacement had cleaned up (seed 1006015 of the
    long simulation run: every row of the sink twice), so once the worker is dead the
    TaskManager sweeps that sink subtask (tests/dataplane shows what a sweep deletes)."""
    keys = log.keys
    world = ManualWorld()
    a = jm(log, world, "jm-a", tmp_path)
    lead(a, world)
    slots = TinySlots()
    t = tm(log, world, tmp_path, slots, n=1)
    register_tm(a, t, world)
    submit(log, world, "j1", source_graph("j1"))
    pump(
        [lambda: a.step(block_ms=None), lambda: t.step(block_ms=None)],
        lambda: len(t.tasks) == 1,
        what="the task on the TaskManager",
        world=world,
        advance_ms=10,
    )
    log.append(
        keys.inbox(keys.taskmanager("tm-1")),
        Envelope(DisconnectTaskManager("tm-1", t.reg.session, 1, "declared lost"), world.new_id(), 1, world.now_ms()),
    )
    t.step(block_ms=None)
    assert slots.killed == [0] and slots.swept == [("file:///tmp/j1-out", 0)] and len(t.tasks) == 0


class StallInCommit(Delegating):
    """Once ``armed``: the next commit script stalls (the test clock moves ``ms``, and
    ``meanwhile()`` runs: others go on) before it reaches the server."""

    def __init__(self, inner: Any, world: ManualWorld, ms: int, meanwhile: Any) -> None:
        super().__init__(inner)
        self.world, self.ms, self.meanwhile, self.armed = world, ms, meanwhile, False

    def script(self, name: str, keys: Any, args: Any) -> Any:
        if self.armed and name == "commit":
            self.armed = False
            self.world.advance(self.ms)
            self.meanwhile()
        return self.inner.script(name, keys, args)


@pytest.mark.timeout(30)
def test_bug7_a_stall_after_the_read_does_not_make_live_taskmanagers_look_lost(log: EventLog, tmp_path: Path) -> None:
    """The leader reads the cluster inbox to its end, then its step stalls for 2 s while it
    commits (a GC pause, a slow Redis; timeout 1 s). Both TaskManagers keep sending
    heartbeats meanwhile. Timeouts decided right after the stall would judge tm-2 on a view
    2 s old, with its heartbeats unread: the leader waits for its next read instead. The
    simulation found this window once it checked that no TaskManager is declared lost while
    a heartbeat it sent within the timeout waits unread. Timeouts still work: tm-2, silent
    afterwards, is lost."""
    keys = log.keys
    world = ManualWorld()
    inbox = keys.inbox(keys.cluster)

    def beat(rid: str) -> Envelope:
        return Envelope(TaskManagerHeartbeat(rid, "s1", 1, 1), world.new_id(), 0, world.now_ms())

    stall = StallInCommit(log.backend, world, 2_000, lambda: log.append_batch(inbox, [beat("tm-1"), beat("tm-2")]))
    a = jm(EventLog(stall, keys), world, "jm-a", tmp_path, config=MembershipConfig(100, 1000))
    lead(a, world)
    for rid in ("tm-1", "tm-2"):
        log.append(inbox, register_message(world, rid, epoch=1))
    pump(
        [lambda: a.step(block_ms=None)],
        lambda: len(a.state.membership.active()) == 2,
        what="two registrations",
        world=world,
        advance_ms=10,
    )

    def lost() -> list[str]:
        return [f.resource_id for f in events(log, keys.facts(keys.cluster), TaskManagerLost)]

    world.advance(300)
    log.append(inbox, beat("tm-1"))
    stall.armed = True
    a.step(block_ms=None)  # reads tm-1's heartbeat, stalls 2 s in its commit
    assert not stall.armed and lost() == []
    a.step(block_ms=None)  # reads what came during the stall: both are alive
    assert lost() == [] and sorted(r.resource_id for r in a.state.membership.active()) == ["tm-1", "tm-2"]
    for _ in range(8):  # then only tm-1 speaks
        world.advance(200)
        log.append(inbox, beat("tm-1"))
        a.step(block_ms=None)
    assert lost() == ["tm-2"]
    assert a.errors == []
