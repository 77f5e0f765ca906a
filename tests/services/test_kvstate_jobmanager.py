"""The JobManager shell with queryable state, on real Redis: refused notifications are
recorded and the leader goes on, a failed attempt's state is deleted, and disposing an
ended job releases its locations and deletes its state."""

from __future__ import annotations

import threading

import orjson

from sluice.events import (
    CancelJob,
    DisposeJob,
    Envelope,
    JobDisposed,
    JobRefused,
    JobRegistered,
    JobStatus,
    KeyGroupRange,
    KvStateNotificationRefused,
    NotifyKvStateRegistered,
    NotifyKvStateUnregistered,
    TaskManagerRegistered,
    TaskState,
    UpdateTaskExecutionState,
)
from sluice.services.jobmanager import JobManager
from sluice.services.jobs.state import JobsState, evolve
from sluice.services.membership import MembershipConfig
from sluice.store import EventLog, KvStates, Out
from tests.e2e.conftest import wait_until
from tests.services.test_kvstate_core import V, running
from tests.services.test_state_client import commit


def job_state(log: EventLog):
    state = JobsState()
    for _, env in log.replay(log.keys.facts(log.keys.job("j1"))):
        evolve(state, env)
    return state.jobs["j1"]


def send(log: EventLog, msg, stream: str | None = None) -> None:
    log.append(stream or log.keys.inbox(log.keys.job("j1")), Envelope(msg, f"m-{id(msg)}", 0, 1, "j1"))


def test_bad_notifications_never_crash_the_leader_and_disposing_cleans_up(log: EventLog) -> None:
    sim, (t0, t1) = running()
    commit(log, sim.log)
    tag = log.keys.cluster
    log.commit(
        tag,
        0,
        [
            Out(log.keys.facts(tag), Envelope(f, f"c{i}", 0, 1))
            for i, f in enumerate(
                [
                    TaskManagerRegistered("tm-1", "s", "h", 4),
                    TaskManagerRegistered("tm-2", "s", "h", 4),
                    JobRegistered("j1", "wc"),
                ]
            )
        ],
    )
    store = KvStates(log.client, log.keys)
    for t in (t0, t1):
        store.write("j1", f"sid{t.subtask}", [("w", orjson.dumps(t.subtask))], {})
    stop = threading.Event()
    jm = JobManager(log, config=MembershipConfig(1000, 600_000), lease_ttl_ms=2000)
    thread = threading.Thread(target=jm.run, args=(stop,), daemon=True)
    thread.start()
    try:
        rng = lambda t: KeyGroupRange(0, 63) if t.subtask == 0 else KeyGroupRange(64, 127)
        for t in (t0, t1):
            send(
                log,
                NotifyKvStateRegistered("j1", V, rng(t), "counts", f"sid{t.subtask}", "redis://x:1/0", t.execution_id),
            )
        bad = [
            NotifyKvStateUnregistered("j1", V, KeyGroupRange(0, 3), "nope"),
            NotifyKvStateUnregistered("j1", "lines -> tokenize", KeyGroupRange(0, 63), "counts"),
            NotifyKvStateRegistered("j1", V, KeyGroupRange(0, 500), "counts", "s", "a", t0.execution_id),
            NotifyKvStateRegistered("other", V, KeyGroupRange(0, 5), "counts", "s", "a", t0.execution_id),
        ]
        for msg in bad:
            send(log, msg)
        wait_until(
            lambda: (
                sum(
                    isinstance(e.event, KvStateNotificationRefused)
                    for _, e in log.replay(log.keys.facts(log.keys.job("j1")))
                )
                == 4
            ),
            "the refusals",
        )
        reasons = [
            e.event.reason
            for _, e in log.replay(log.keys.facts(log.keys.job("j1")))
            if isinstance(e.event, KvStateNotificationRefused)
        ]
        assert [r.split(":")[0] for r in reasons] == [
            "unknown registration name 'nope' in job j1",
            "vertex 'lines -> tokenize' cannot unregister KvState 'counts'",
            "key-group range 0..500 of 'counts' is outside 0..127 (the job's max parallelism is 128)",
            "job not found",
        ]
        assert job_state(log).kvstate.locations["counts"].registered_key_groups == 128
        # A failed attempt: unregistered by the leader and its state deleted.
        send(log, UpdateTaskExecutionState("j1", t0.execution_id, TaskState.FAILED, "boom"))
        wait_until(lambda: not log.client.exists(store.key("j1", "sid0")), "the failed attempt's state to go")
        assert log.client.exists(store.key("j1", "sid1"))
        # Disposing a running job is refused; once it ended, its state goes.
        inbox = log.keys.inbox(log.keys.client("c1"))
        send(log, DisposeJob("j1", inbox), log.keys.inbox(tag))
        refused = wait_until(lambda: [e.event for _, e in log.replay(inbox)], "the dispose reply")
        assert isinstance(refused[0], JobRefused) and "cancel it first" in refused[0].reason
        send(log, CancelJob("j1", "bye"))
        wait_until(lambda: job_state(log).status == JobStatus.CANCELLING, "the job to cancel")
        for ex in job_state(log).executions():
            if ex.state == TaskState.CANCELING:
                send(log, UpdateTaskExecutionState("j1", ex.id, TaskState.CANCELED))
        wait_until(lambda: job_state(log).status == JobStatus.CANCELED, "the job to be cancelled")
        assert job_state(log).kvstate.locations == {}
        send(log, DisposeJob("j1", inbox), log.keys.inbox(tag))
        done = wait_until(
            lambda: [e.event for _, e in log.replay(inbox) if isinstance(e.event, JobDisposed)], "the dispose reply"
        )
        assert done[0].state_ids == ["sid0", "sid1"]
        assert not log.client.exists(store.key("j1", "sid1"))
        assert thread.is_alive() and log.length(log.keys.dead(log.keys.job("j1"))) == 0
    finally:
        stop.set()
        thread.join(timeout=10)
