"""An inbox key that holds another kind of value (something other than Sluice wrote it),
on a real Redis.

The leader reads the cluster inbox and every running job's inbox in one XREADGROUP, and
Redis answers WRONGTYPE for all of them when one key is not a stream: one clobbered job
inbox stopped the whole leader, for ever (each step failed, stepped down, rebuilt, and
failed again), and no other job was taken. (A TaskManager's reports such an inbox
refuses: tests/services/test_taskmanager_reports.py.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sluice.events import JobStatus, TaskState
from sluice.store import EventLog
from sluice.store.backend import Delegating
from tests.services.failover_helpers import (
    WrittenAgainAtOnce,
    events,
    job_state,
    pump,
    report,
    source_graph,
    started,
    submit,
)


def clobber(log: EventLog, key: str, value: bytes = b"someone else's") -> None:
    log.backend.delete(key)
    log.backend.set(key, value)


def set_aside(log: EventLog, key: str) -> list[str]:
    """Where the value found in place of the inbox ``key`` was moved (``Keys.set_aside``)."""
    client = log.backend.client  # type: ignore[attr-defined]
    return [k.decode() for k in client.keys("*") if k.decode().startswith(key + ":not-a-stream:")]


@pytest.mark.timeout(60)
def test_a_job_inbox_that_is_not_a_stream_stops_neither_the_leader_nor_the_job(log: EventLog, tmp_path: Path) -> None:
    keys = log.keys
    world, a, t, slots = started(log, tmp_path)
    steps = [lambda: a.step(block_ms=None), lambda: t.step(block_ms=None)]
    submit(log, world, "j1", source_graph("j1", splits=1))
    pump(steps, lambda: len(slots.launched) == 1, what="j1's launch", world=world, advance_ms=10)
    pump(
        steps,
        lambda: job_state(log, "j1").vertices["src"].subtasks[0].state == TaskState.INITIALIZING,
        what="j1's INITIALIZING",
        world=world,
        advance_ms=10,
    )
    inbox = keys.inbox(keys.job("j1"))
    clobber(log, inbox)
    submit(log, world, "j2", source_graph("j2", splits=1))
    pump(steps, lambda: len(slots.launched) == 2, what="j2's launch (the leader went on)", world=world, advance_ms=10)
    assert a.leading
    (aside,) = set_aside(log, inbox)
    assert log.backend.get(aside) == b"someone else's"  # kept for a person to look at
    (_, descriptor, _) = slots.launched[0]
    report(log, world, descriptor, "tm-1", 0, TaskState.RUNNING)
    report(log, world, descriptor, "tm-1", 0, TaskState.FINISHED)
    pump(steps, lambda: job_state(log, "j1").status == JobStatus.FINISHED, what="j1's end", world=world, advance_ms=10)


@pytest.mark.timeout(30)
def test_a_client_moves_a_clobbered_cluster_inbox_aside_or_says_what_is_wrong(log: EventLog) -> None:
    from sluice.client import Client, JobFile
    from sluice.errors import WrongType

    keys = log.keys
    cluster = keys.inbox(keys.cluster)
    job = JobFile(Path("j.py"), b"# nothing\n", "0" * 64, "j", None, source_graph("j1", splits=1), {})
    clobber(log, cluster)
    Client(log, "c1").submit(job, job_id="j1")
    assert [type(e).__name__ for e in events(log, cluster)] == ["SubmitJob"]
    (aside,) = set_aside(log, cluster)
    assert log.backend.get(aside) == b"someone else's"
    hostile = EventLog(WrittenAgainAtOnce(log.backend, cluster), keys)
    clobber(log, cluster)
    with pytest.raises(WrongType, match="something other than Sluice keeps writing that key"):
        Client(hostile, "c1", refused_wait_s=0.3).submit(job, job_id="j2")


class ReaderRepairsFirst(Delegating):
    """The writer's append meets the clobbered key, and its reader moves it aside (making
    the inbox again with its group) before the writer's own repair runs."""

    def __init__(self, inner: Any, log: EventLog) -> None:
        super().__init__(inner)
        self.reader, self.done = log, False

    def around(self, name: str, call: Any) -> Any:
        if name == "xadd" and not self.done:
            self.done = True
            try:
                return call()
            finally:
                self.reader.set_aside([self.reader.keys.inbox(self.reader.keys.cluster)], "jm")
        return call()


def test_a_writer_whose_inbox_its_reader_repaired_first_appends_all_the_same(log: EventLog) -> None:
    """Found by review: the writer's repair then moved nothing, and it gave up on a stream
    that was fine again (a TaskManager dropped its message to the leader)."""
    from tests.helpers import env, heartbeat

    cluster = log.keys.inbox(log.keys.cluster)
    clobber(log, cluster)
    writer = EventLog(ReaderRepairsFirst(log.backend, log), log.keys)
    sent = env(heartbeat())
    writer.append(cluster, sent)
    assert [e for _, e in log.replay(cluster)] == [sent]


def test_a_taskmanager_whose_goodbye_is_refused_does_not_say_it_unregistered(log: EventLog, tmp_path: Path) -> None:
    """Its UnregisterTaskManager dropped (the cluster inbox written again at once), a
    TaskManager says it could not say goodbye instead of "unregistered"; said, it says so."""
    from structlog.testing import capture_logs

    _, _, t, _ = started(log, tmp_path)
    cluster = log.keys.inbox(log.keys.cluster)
    t.to_leader.log = EventLog(WrittenAgainAtOnce(log.backend, cluster), log.keys)
    clobber(log, cluster)
    with capture_logs() as logs:
        t.leave()
    said = [(e["log_level"], e["event"]) for e in logs]
    assert ("info", "unregistered") not in said
    assert any(level == "warning" and "could not say goodbye" in what for level, what in said), said
    t.to_leader.log = log
    with capture_logs() as logs:
        t.leave()
    assert ("info", "unregistered") in [(e["log_level"], e["event"]) for e in logs]
