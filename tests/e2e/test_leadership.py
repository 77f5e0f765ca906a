"""Two JobManagers: one leads, one waits; kill -9 the leader and the standby takes over
from the log; a deposed leader that wakes up cannot write (fencing)."""

from __future__ import annotations

import signal
import time

import pytest

from sluice.errors import StaleEpoch
from sluice.events import AlreadyRegistered, LeadershipGranted, TaskManagerRegistered
from sluice.store import EventLog, Out, current_leader
from tests.e2e.conftest import MARGIN, TEARDOWN, Processes, facts, registered, wait_until
from tests.helpers import env


def grants(log: EventLog) -> list[LeadershipGranted]:
    return [e.event for e in facts(log) if isinstance(e.event, LeadershipGranted)]


START_PAIR = 3 * 20
"""start_pair's waits."""


def start_pair(procs: Processes, log: EventLog) -> tuple[str, str]:
    procs.start("jm-a", "jobmanager", "--id", "jm-a")
    wait_until(lambda: grants(log), "jm-a to lead")
    procs.start("jm-b", "jobmanager", "--id", "jm-b")
    procs.start("tm1", "taskmanager", "--resource-id", "tm-1")
    procs.start("tm2", "taskmanager", "--resource-id", "tm-2")
    wait_until(lambda: registered(log) == {"tm-1", "tm-2"}, "registrations")
    wait_until(lambda: "standby" in procs.output("jm-b"), "jm-b to stand by")
    return "jm-a", "jm-b"


@pytest.mark.timeout(START_PAIR + 20 + 20 + 2 * 20 + 1 + MARGIN + TEARDOWN)  # takeover, log, 2 TMs
def test_the_standby_takes_over_from_a_killed_leader_and_rebuilds_from_the_log(procs: Processes, log: EventLog) -> None:
    start_pair(procs, log)
    assert [g.leader_id for g in grants(log)] == ["jm-a"]
    procs.signal("jm-a", signal.SIGKILL)
    killed = time.monotonic()
    wait_until(lambda: len(grants(log)) == 2, "a takeover")
    assert time.monotonic() - killed >= 0.3  # it waited for the lease to run out
    second = grants(log)[1]
    assert (second.leader_id, second.epoch) == ("jm-b", 2)
    assert current_leader(log).holder == "jm-b"
    out = wait_until(lambda: "replayed=" in (o := procs.output("jm-b")) and o, "jm-b to say it leads")
    assert "taskmanagers=2" in out
    # The TaskManagers notice the new epoch and register again: the new leader knows them
    # from the log, so they are AlreadyRegistered (committed by it, at its epoch), not new,
    # and nobody was lost.
    for rid in ("tm-1", "tm-2"):
        inbox = log.keys.inbox(log.keys.taskmanager(rid))
        wait_until(
            lambda inbox=inbox: any(
                isinstance(e.event, AlreadyRegistered) and e.event.epoch == 2 and e.epoch == 2
                for _, e in log.replay(inbox)
            ),
            f"{rid} to re-register",
        )
    assert sum(isinstance(e.event, TaskManagerRegistered) for e in facts(log)) == 2
    time.sleep(1.0)
    assert registered(log) == {"tm-1", "tm-2"}


@pytest.mark.timeout(START_PAIR + 20 + 1 + 20 + MARGIN + TEARDOWN)  # the pair, the takeover, deposed
def test_a_deposed_leader_that_wakes_up_is_fenced(procs: Processes, log: EventLog) -> None:
    start_pair(procs, log)
    procs.signal("jm-a", signal.SIGSTOP)  # a long GC pause, a frozen VM...
    wait_until(lambda: len(grants(log)) == 2, "the standby to take over")
    time.sleep(1.0)  # longer than the heartbeat timeout
    procs.signal("jm-a", signal.SIGCONT)
    # jm-a learns it lost either from its renewal thread (the lease is someone else's) or
    # from a refused write. It judges heartbeats only on a view of the inbox read after it
    # woke, so it need not try to declare every TaskManager lost first; if it writes
    # anything, the fence refuses it.
    wait_until(
        lambda: " deposed " in procs.output("jm-a") or "lost the lease" in procs.output("jm-a"),
        "jm-a to learn it was deposed",
    )
    out = procs.output("jm-a")
    if " deposed " in out:  # (the log line, not the test's own directory in a path)
        assert "writer epoch 1 is older than the fence at epoch 2" in out
    # Nothing jm-a decided after waking up reached the log.
    takeover = next(
        i for i, e in enumerate(facts(log)) if isinstance(e.event, LeadershipGranted) and e.event.epoch == 2
    )
    assert all(e.epoch == 2 for e in facts(log)[takeover:])
    assert registered(log) == {"tm-1", "tm-2"}
    # jm-a is a standby now; and any write at its old epoch is refused.
    with pytest.raises(StaleEpoch):
        log.commit(log.keys.cluster, 1, [Out(log.keys.facts(log.keys.cluster), env(LeadershipGranted(1, "jm-a", "h")))])
