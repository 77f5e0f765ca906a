"""Fast failover on a real redis-server: a new leader starts from the snapshots the last one
wrote, an unreadable snapshot means a full replay with a warning, jobs that ended leave the
replay but are still answered, and a deposed leader writes no snapshot."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from sluice.errors import StaleEpoch
from sluice.events import DisposeJob, Envelope, JobDisposed, JobRefused
from sluice.store import EventLog, Snapshots
from tools.bench.recovery import _take_over, _Writer
from tools.sim.invariants import normal_jobs, normal_membership


def _log_with(log: EventLog, finished: int = 0, facts: int = 600) -> list[str]:
    w = _Writer(log)
    jobs = [f"done-{i}" for i in range(finished)] + ["live"]
    w.cluster(jobs)
    for j in jobs[:-1]:
        w.job(j, 2, 20, finish=True)
    w.job("live", 4, facts)
    return jobs


def _snapshot_and_leave(jm) -> None:
    jm.snapshots.next_due = 0
    jm.snapshots.tick(jm.world.now_ms())
    jm.job_inboxes.close_coordinators()
    jm.lease.release()


def test_a_new_leader_starts_from_the_snapshots_and_folds_only_the_rest(log: EventLog) -> None:
    _log_with(log)
    *_, first = _take_over(log, "jm-a")
    assert first.snapshots is not None
    _snapshot_and_leave(first)
    *_, second = _take_over(log, "jm-b")
    assert normal_jobs(second.state.jobs) == normal_jobs(first.state.jobs)
    assert normal_membership(second.state.membership) == normal_membership(first.state.membership)
    stored = Snapshots(log).read(log.keys.job("live"))
    assert stored is not None and stored.position != "0-0"
    second.job_inboxes.close_coordinators()


def test_a_replay_from_snapshots_reads_only_the_facts_after_them(log: EventLog) -> None:
    from sluice.services.jobmanager.leadership import Replay

    _log_with(log, facts=900)
    *_, first = _take_over(log, "jm-a")
    _snapshot_and_leave(first)
    full, fast = Replay(log, lambda tag: None, snapshots=False), Replay(log, lambda tag: None)
    while not full.step():
        pass
    while not fast.step():
        pass
    assert fast.result.from_snapshots == 2 and fast.result.facts < 10 < full.result.facts
    assert normal_jobs(fast.result.jobs) == normal_jobs(full.result.jobs)
    assert fast.result.checkpoints == full.result.checkpoints
    assert fast.result.tails == full.result.tails


def test_a_corrupt_snapshot_means_a_full_replay_with_a_warning(log: EventLog) -> None:
    _log_with(log)
    *_, first = _take_over(log, "jm-a")
    _snapshot_and_leave(first)
    log.client.hset(log.keys.snapshot(log.keys.job("live")), "data", b'{"v": 1, "kind": "job", "run": 7')
    log.client.hset(log.keys.snapshot(log.keys.cluster), "data", b'{"v": 2, "kind": "cluster"}')
    with capture_logs() as logs:
        *_, second = _take_over(log, "jm-b")
    warned = [e for e in logs if e["event"].startswith("snapshot unreadable")]
    assert {e["tag"] for e in warned} == {log.keys.cluster, log.keys.job("live")}
    assert "schema version 2" in " ".join(e["error"] for e in warned)
    leading = next(e for e in logs if e["event"] == "leading")
    assert leading["from_snapshots"] == 0
    assert normal_jobs(second.state.jobs) == normal_jobs(first.state.jobs)
    second.job_inboxes.close_coordinators()


def test_finished_jobs_leave_the_replay_but_are_still_answered(log: EventLog) -> None:
    jobs = _log_with(log, finished=3)
    *_, first = _take_over(log, "jm-a")
    assert len(first.state.jobs.jobs) == 4
    first.step()
    assert set(first.state.jobs.jobs) == {"live"}, "ended jobs are archived at the leader's first tick"
    _snapshot_and_leave(first)
    with capture_logs() as logs:
        *_, second = _take_over(log, "jm-b")
    leading = next(e for e in logs if e["event"] == "leading")
    assert leading["archived"] == 3 and leading["jobs"] == 1
    assert set(second.state.jobs.jobs) == {"live"} and second.registered == set(jobs)  # ids stay taken
    # A message about an archived job: the job is loaded from its snapshot and answered.
    reply_to = log.keys.inbox(log.keys.client("c1"))
    log.append(log.keys.inbox(log.keys.cluster), Envelope(DisposeJob("done-1", reply_to), "m1"))
    log.append(log.keys.inbox(log.keys.cluster), Envelope(DisposeJob("nope", reply_to), "m2"))
    for _ in range(5):
        second.step()
    replies = [env.event for _, env in log.replay(reply_to)]
    assert isinstance(replies[0], JobDisposed) and replies[0].job_id == "done-1"
    assert isinstance(replies[1], JobRefused) and "job not found" in replies[1].reason
    second.job_inboxes.close_coordinators()


def test_a_deposed_leader_writes_no_snapshot(log: EventLog) -> None:
    _log_with(log)
    *_, jm = _take_over(log, "jm-a")
    assert jm.epoch is not None
    before = Snapshots(log).read(log.keys.job("live"))
    log.fence(log.keys.job("live"), jm.epoch + 1)  # a new leader claimed the job
    jm.snapshots.next_due = 0
    with pytest.raises(StaleEpoch):
        jm.snapshots.tick(jm.world.now_ms())
    assert Snapshots(log).read(log.keys.job("live")) == before
    jm.step()  # in the main loop the refusal makes it step down
    jm.job_inboxes.close_coordinators()


def test_a_restarted_projector_starts_a_job_table_from_the_leaders_snapshot(log: EventLog) -> None:
    """A job's ExecutionGraph and KvStateLocation tables, rebuilt by a projector that starts
    again, fold only the facts after the leader's snapshot (when the snapshot covers no
    more than the tables), and equal the tables a full fold gives."""
    from sluice.services.projector import Projector
    from sluice.store import ReadModels

    _log_with(log, facts=900)
    *_, jm = _take_over(log, "jm-a")
    _snapshot_and_leave(jm)  # covers every fact so far
    Projector(log).catch_up()  # and so do the tables
    tables = ReadModels(log)
    tag = log.keys.job("live")
    full = {name: tables.read(tag, name) for name in ("executiongraph", "kvstate")}
    restarted = Projector(log)
    folded: list[str] = []
    real = log.replay

    def counting(stream: str, after: str = "0-0", **kw):
        for entry_id, env in real(stream, after, **kw):
            if stream == log.keys.facts(tag):
                folded.append(entry_id)
            yield entry_id, env

    log.replay = counting  # type: ignore[method-assign]
    try:
        restarted.load()
    finally:
        del log.replay
    assert folded == []  # nothing to fold: the snapshot covers the tables' position
    seeded = {r.projection.name: r.state for r in restarted.running if r.tag == tag}
    fresh = Projector(log)
    Snapshots(log).delete(tag)
    fresh.load()
    assert normal_jobs(seeded["executiongraph"]) == normal_jobs(
        next(r.state for r in fresh.running if r.tag == tag and r.projection.name == "executiongraph")
    )
    assert seeded["kvstate"] == next(r.state for r in fresh.running if r.tag == tag and r.projection.name == "kvstate")
    restarted.catch_up()
    assert {name: tables.read(tag, name) for name in ("executiongraph", "kvstate")} == full


def test_a_trail_fed_by_the_leaders_commits_equals_one_read_back_from_the_log(log: EventLog, tmp_path) -> None:
    """The snapshot writer folds a job's facts as the leader commits them, instead of
    reading them back (``SnapshotWriter.committed``): its coordinator trail must be exactly
    what a full replay of the job's facts gives: split assignments, the attempts, a
    checkpoint taken meanwhile."""
    from sluice.events import RequestNextInputSplit, TaskState, TriggerCheckpoint
    from sluice.services.jobmanager.snapshot import CoordinatorTrail
    from tests.services.failover_helpers import pump, report, source_graph, started, submit

    world, a, t, slots = started(log, tmp_path)
    assert a.snapshots is not None
    keys = log.keys
    submit(log, world, "j1", source_graph("j1", splits=6))
    steps = [lambda: t.step(block_ms=None), lambda: a.step(block_ms=None)]
    pump(steps, lambda: len(slots.launched) == 1, what="the source's deployment", world=world, advance_ms=10)
    assert a.snapshots.trails["j1"].fed  # made from the job's first commit, and fed since
    src = slots.launched[0][1]
    report(log, world, src, "tm-1", 0, TaskState.RUNNING)
    inbox = keys.inbox(keys.job("j1"))
    for i in range(3):
        if i == 1:
            log.append(inbox, Envelope(TriggerCheckpoint("j1"), world.new_id(), 0, world.now_ms(), "j1"))
        log.append(
            inbox,
            Envelope(
                RequestNextInputSplit("j1", "src", 0, src["execution_id"], "host-a"),
                world.new_id(),
                0,
                world.now_ms(),
                "j1",
            ),
        )
        for _ in range(3):
            world.advance(10)
            a.step(block_ms=None)
    fed = a.snapshots.trails["j1"]
    replayed = CoordinatorTrail()
    for entry_id, env in log.replay(keys.facts(keys.job("j1"))):
        replayed.fold(entry_id, env)
    assert fed.pos == replayed.pos == log.last_id(keys.facts(keys.job("j1")))
    assert fed.checkpoints and fed.checkpoints == replayed.checkpoints
    assert fed.tails and fed.tails == replayed.tails
    assert fed.attempts == replayed.attempts and fed.parallelism == replayed.parallelism
    a.snapshots.next_due = 0
    a.snapshots.tick(world.now_ms())  # the snapshot is written from the fed trail: no warning, no drop
    assert "j1" in a.snapshots.trails
    a.job_inboxes.close_coordinators()
