"""The log views (stats, dead letters and re-driving them, the KvStateLocation table) on the
session's real redis-server, with a real JobManager driven through its step function."""

from __future__ import annotations

from pathlib import Path

import pytest

import sluice.views.stats as stats_module
from sluice.errors import JobNotFound
from sluice.events import (
    FIELD,
    Envelope,
    JobRegistered,
    JobSlotsFound,
    JobSubmitted,
    KeyGroupRange,
    NotifyKvStateRegistered,
    SubmitJob,
    encode,
)
from sluice.store import Blobs, EventLog, GroupConsumer
from sluice.store.consumer import dead_letter
from sluice.views.deadletters import UnknownDeadLetter, dead_letters, redrive
from sluice.views.history import resolve_at
from sluice.views.kvstate import kvstate
from sluice.views.stats import stats
from sluice.views.timeline import timeline
from tests.services.failover_helpers import CODE, ManualWorld, events, jm, lead, source_graph


@pytest.mark.timeout(60)
def test_stats_dead_letters_and_a_redrive_once_the_cause_is_fixed(
    log: EventLog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = log.keys
    world = ManualWorld()
    a = jm(log, world, "jm-a", tmp_path)
    lead(a, world)
    inbox = keys.inbox(keys.cluster)
    garbage = log.append_raw(inbox, {FIELD: b"not json"})
    a.step(block_ms=None)
    # A good message parked earlier (say, by a JobManager that could not take it then).
    digest = Blobs(log).put(CODE)
    good = {
        FIELD: encode(
            Envelope(
                SubmitJob("j9", source_graph("j9"), digest, "failover_job", keys.inbox(keys.client("c1")), {}),
                world.new_id(),
                0,
                world.now_ms(),
                "j9",
            )
        )
    }
    dead_letter(log, inbox, "", "1-1", good, "refused", "the JobManager could not take it then")
    # An outbox entry for an address that is not an inbox here.
    outbox = keys.outbox(keys.job("j9"))
    dead_letter(
        log,
        outbox,
        "",
        "2-1",
        {FIELD: good[FIELD], b"to": b"elsewhere"},
        "undeliverable",
        "'elsewhere' is not an inbox of this cluster",
    )
    # An entry read and never acknowledged, for the pending figures.
    readers = GroupConsumer(log, inbox, "readers", "r1")
    readers.ensure_group("$")
    log.append_raw(inbox, good)
    assert len(readers.read(block_ms=None)) == 1

    letters = dead_letters(log)
    assert [(d["stream"], d["entry"]) for d in letters] == [(inbox, garbage), (inbox, "1-1"), (outbox, "2-1")]
    bad, parked, lost = letters
    assert bad["kind"] and bad["reason"] and (parked["kind"], lost["kind"]) == ("refused", "undeliverable")
    assert bad["type"] is None and bad["data"] == "not json" and bad["redrivable"]
    assert (parked["type"], parked["job_id"], parked["redrivable"]) == ("SubmitJob", "j9", True)
    assert (lost["to"], lost["redrivable"]) == ("elsewhere", False)

    s = stats(log, window_s=3600)
    rows = {r["stream"]: r for r in s["streams"]}
    facts = keys.facts(keys.cluster)
    assert rows[facts]["kind"] == "facts" and rows[facts]["length"] >= 1 and rows[facts]["memory_bytes"] > 0
    assert rows[keys.dead(keys.cluster)]["length"] == 2
    kinds = {e["type"]: e for e in s["events"]}
    assert kinds["LeadershipGranted"]["by_kind"] == {"facts": 1} and kinds["LeadershipGranted"]["rate_per_s"] > 0
    groups = {(g["stream"], g["group"]): g for g in s["groups"]}
    jmg, mine = groups[(inbox, "jobmanager")], groups[(inbox, "readers")]
    assert jmg["pending"] == 0 and jmg["oldest_pending"] is None
    assert (mine["pending"], mine["lag"], mine["oldest_pending"]) == (1, 0, log.last_id(inbox))
    assert mine["oldest_pending_age_s"] >= 0 and mine["oldest_pending_idle_s"] >= 0
    assert (mine["lag_counted"], jmg["lag_counted"]) == (False, False)
    assert s["dead_letters"]["total"] == 3
    assert {(r["kind"], r["count"]) for r in s["dead_letters"]["by_reason"]} >= {("refused", 1), ("undeliverable", 1)}

    # A stream with more entries in the window than are read is sampled: its newest entries,
    # rates over the time they span.
    monkeypatch.setattr(stats_module, "READ_PER_STREAM", 2)
    few = stats(log, window_s=3600)
    assert few["events_sampled"] == [inbox]  # the one inbox with entries (2: as many as read, maybe more)
    assert sum(e["by_kind"].get("inbox", 0) for e in few["events"]) == 2
    assert s["events_sampled"] == []
    monkeypatch.undo()

    # Where Redis cannot say a group's lag (moved with XGROUP SETID over a deleted entry), it is counted.
    log.append_raw(inbox, {FIELD: b"to be deleted"})
    log.client.xdel(inbox, log.last_id(inbox))
    log.backend.group_setid(inbox, "readers", garbage)
    moved = {(g["stream"], g["group"]): g for g in stats(log, window_s=3600)["groups"]}[(inbox, "readers")]
    assert (moved["lag"], moved["lag_counted"]) == (1, True)  # the entry after the garbage one

    # Re-driving the good one: back on the cluster inbox, gone from the dead letters, taken.
    out = redrive(log, parked["id"], parked["dead_stream"])  # (its id alone may be another tag's dead letter's too)
    assert out["stream"] == inbox and out["redriven_as"] == log.last_id(inbox)
    assert [d["entry"] for d in dead_letters(log)] == [garbage, "2-1"]
    for _ in range(3):
        a.step(block_ms=None)
    assert [e.job_id for e in events(log, facts, JobRegistered)] == ["j9"]

    with pytest.raises(UnknownDeadLetter, match=f"no dead letter {parked['id']} under prefix .*sluice inspect dead"):
        redrive(log, parked["id"], parked["dead_stream"])
    with pytest.raises(UnknownDeadLetter, match="'yesterday' is not a dead letter's id .*1763870000000-0"):
        redrive(log, "yesterday")
    with pytest.raises(UnknownDeadLetter, match="came from .*outbox, not an inbox .*'elsewhere'.*only an inbox"):
        redrive(log, lost["id"], lost["dead_stream"])


@pytest.mark.timeout(30)
def test_the_kvstate_table_now_and_before_a_registration(log: EventLog) -> None:
    world = ManualWorld()
    facts = log.keys.facts(log.keys.job("j1"))
    g = source_graph("j1", parallelism=2)

    def fact(ev: object) -> str:
        return log.append(facts, Envelope(ev, world.new_id(), 1, world.now_ms(), "j1"))  # type: ignore[arg-type]

    fact(JobSubmitted("j1", g, "blob", "m", "reply", {}, {}, "file:///tmp"))
    before = fact(JobSlotsFound("j1"))  # (a fact before the first registration)
    fact(NotifyKvStateRegistered("j1", "src", KeyGroupRange(0, 63), "counts", "state-a", "redis://a:1/0", "src:0:0"))
    fact(NotifyKvStateRegistered("j1", "src", KeyGroupRange(64, 127), "counts", "state-b", "redis://a:1/0", "src:1:0"))
    (row,) = kvstate(log, "j1")
    assert (row["name"], row["vertex"], row["num_key_groups"], row["registered_key_groups"]) == (
        "counts",
        "src",
        128,
        128,
    )
    assert [(r["start"], r["end"], r["state_id"], r["execution_id"]) for r in row["ranges"]] == [
        (0, 63, "state-a", "src:0:0"),
        (64, 127, "state-b", "src:1:0"),
    ]
    assert kvstate(log, "j1", resolve_at(before)) == []
    told = [e["text"] for e in timeline(log, "j1")["events"] if e["kind"] == "kvstate"]
    assert told[0] == "queryable state 'counts' of src: key groups 0..63 registered by src:0:0 at redis://a:1/0"
    with pytest.raises(JobNotFound, match="job 'nope' not found"):
        kvstate(log, "nope")


def test_an_unreadable_envelope_is_still_listed(log: EventLog) -> None:
    inbox = log.keys.inbox(log.keys.cluster)
    dead_letter(
        log,
        inbox,
        "",
        "5-0",
        {FIELD: encode(Envelope(JobRegistered("x", "y"), "i", 0, 1))[:-3]},
        "not-json",
        "cut short",
    )
    (d,) = dead_letters(log)
    assert d["type"] is None and d["reason"] == "cut short" and d["entry"] == "5-0" and d["at"] > 5
