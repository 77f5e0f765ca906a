"""A JobManager that cannot read the log it would lead (issue 28, finding 2), on a real
redis-server, driving real JobManagers step by step on a test clock.

A fact its replay cannot decode (a newer schema version, an unknown type, bytes no Sluice
wrote) made it step down and take its own lease again at once, ~29 times a second, for
ever: no JobManager that could read the fact could lead. Now it releases the lease, backs
off, says once which entry and why, and, while that entry is there, stays a standby
without taking the lease. A mixed-version pair: the newer one leads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from sluice.events import FIELD, Envelope, LeadershipGranted, encode
from sluice.services.jobmanager import Phase
from sluice.store import EventLog, current_leader
from tests.services.failover_helpers import ManualWorld, events, jm, lead
from tools.sim.skew import NEWER, as_newer, newer_decode

STEP_MS = 100


def takeovers(log: EventLog) -> int:
    """How many times the lease was taken (the epoch counter)."""
    return int(log.client.get(log.keys.epoch) or 0)


def run(jms: list[Any], world: ManualWorld, seconds: float) -> None:
    """Step each JobManager (its loop and its renewal) every ``STEP_MS`` of test time."""
    for _ in range(int(seconds * 1000 / STEP_MS)):
        for j in jms:
            j.step(block_ms=None)
            j.step_lease()
        world.advance(STEP_MS)


def unreadable_lines(logs: list[dict]) -> list[dict]:
    return [e for e in logs if e["event"].startswith("cannot read the log")]


def a_newer_grant(log: EventLog, world: ManualWorld, epoch: int) -> str:
    """What a newer leader of ``epoch`` appends to the cluster's facts: its grant, at schema
    version ``NEWER``."""
    raw = encode(Envelope(LeadershipGranted(epoch, "jm-new", "host", "run"), world.new_id(), epoch, world.now_ms()))
    newer = as_newer(raw)
    assert newer is not None
    return log.append_raw(log.keys.facts(log.keys.cluster), {FIELD: newer})


def test_a_mixed_version_pair_the_newer_leads_and_the_older_stands_by_without_taking_the_lease(
    log: EventLog, tmp_path: Path
) -> None:
    world = ManualWorld()
    newer_log = EventLog(log.backend, log.keys, decode=newer_decode)
    new = jm(newer_log, world, "jm-new", tmp_path)
    old = jm(log, world, "jm-old", tmp_path)
    epoch = lead(new, world)
    entry = a_newer_grant(log, world, epoch)
    # The newer one goes (upgraded again, restarted): the lease is free and the older one takes it.
    new.step_down()
    new.lease.release()
    with capture_logs() as logs:
        run([old], world, 30.0)
    assert old.errors == [] and old.phase is Phase.STANDBY
    assert current_leader(log) is None, "the older JobManager holds the lease of a log it cannot read"
    assert takeovers(log) == epoch + 1, "it took the lease again and again (it spins)"
    (line,) = unreadable_lines(logs)  # said once, whatever the retries
    assert line["log_level"] == "error" and line["stream"] == log.keys.facts(log.keys.cluster)
    assert line["entry"] == entry and line["served"] is False
    assert f"schema version {NEWER} of LeadershipGranted is newer than this JobManager knows" in line["what_to_do"]
    assert old.metrics.log_unreadable.labels("unsupported schema version")._value.get() == 1
    # It committed nothing: the last grant in the log is the newer one's.
    grants = [
        e.event.epoch
        for _, e in newer_log.replay(log.keys.facts(log.keys.cluster))
        if isinstance(e.event, LeadershipGranted)
    ]
    assert grants == [epoch, epoch]

    # The newer one comes back: it leads at once, and the older one stays a standby.
    assert lead(new, world, timeout=2.0) == epoch + 2
    run([new, old], world, 20.0)
    assert new.leading and new.errors == [] and old.phase is Phase.STANDBY and old.errors == []
    assert current_leader(log).holder == "jm-new"  # type: ignore[union-attr]
    # It goes again: the older one looks at the entry without taking the lease, and stands by.
    new.step_down()
    new.lease.release()
    before = takeovers(log)
    run([old], world, 60.0)
    assert takeovers(log) == before and current_leader(log) is None and old.errors == []


CORRUPT = {
    "unknown type": (
        b'{"type":"TaskStateChanged","v":1,"id":"x","job":null,"epoch":1,"ts":1,"cause":null,"payload":{}}',
        "a later Sluice wrote an event type",
    ),
    "corrupt bytes": (b'{"type":"LeadershipGr\xff', "no Sluice can read this entry"),
}


@pytest.mark.parametrize("kind", sorted(CORRUPT))
def test_a_fact_no_one_can_read_leaves_no_one_spinning_and_says_what_to_do(
    log: EventLog, tmp_path: Path, kind: str
) -> None:
    """Neither of two JobManagers can read the fact: each takes the lease at most once,
    gives it back, says once what it met and what to do, and looks again (without the
    lease) after a growing wait; once the entry is gone, one of them leads."""
    raw, says = CORRUPT[kind]
    world = ManualWorld()
    a, b = jm(log, world, "jm-a", tmp_path), jm(log, world, "jm-b", tmp_path)
    lead(a, world)
    facts = log.keys.facts(log.keys.cluster)
    entry = log.append_raw(facts, {FIELD: raw})
    a.step_down()
    a.lease.release()
    with capture_logs() as logs:
        run([a, b], world, 60.0)
    assert a.errors == [] and b.errors == [] and current_leader(log) is None
    assert takeovers(log) <= 3, f"the lease was taken {takeovers(log) - 1} times in 60 s"
    lines = unreadable_lines(logs)
    assert 1 <= len(lines) <= 2 and {line["entry"] for line in lines} == {entry}  # once per JobManager at most
    assert says in lines[0]["what_to_do"] and f"sluice inspect tail {facts}" in lines[0]["what_to_do"]

    log.client.xdel(facts, entry)  # dealt with: a JobManager leads within its wait (at most a minute)
    run([a, b], world, 61.0)
    assert a.leading or b.leading
    assert a.errors == [] and b.errors == []
    assert events(log, facts, LeadershipGranted)[-1].epoch == takeovers(log)
    for j in (a, b):
        j.job_inboxes.close_coordinators()
