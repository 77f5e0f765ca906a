"""What any backend of the log must do. Backends subclass ``LogContract`` and provide
the ``log`` fixture (see test_log_redis.py, test_log_docker.py)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from sluice.errors import ScriptError, StaleEpoch, StoreError, StoreRestarted
from sluice.events import FIELD, Envelope, TaskManagerRegistered, decode
from sluice.store import Consumed, Deliverer, EventLog, GroupConsumer, LeaderLease, Out, ReadModels, Snapshots
from sluice.store.backend import Delegating, GroupState, NoGroup, ScriptFailed
from sluice.store.keys import tag_of
from tests.helpers import env, heartbeat, register


def pending(log: EventLog, inbox: str, group: str = "jm") -> int:
    state = log.backend.group_state(inbox, group)
    return state.pending if state else 0


class Counting(Delegating):
    """A backend that records the name of every call it passes on (``script:NAME`` for a script)."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.calls: list[str] = []

    def around(self, name: str, call: Any) -> Any:
        self.calls.append(name)
        return call()


def registered(rid: str) -> TaskManagerRegistered:
    return TaskManagerRegistered(rid, "s", "h", 1)


class LogContract:
    # --- appending and replay -------------------------------------------------------------

    def test_append_then_replay_in_order(self, log: EventLog) -> None:
        stream = log.keys.facts(log.keys.cluster)
        sent = [env(registered(f"tm-{i}")) for i in range(10)]
        ids = [log.append(stream, sent[0])] + log.append_batch(stream, sent[1:])
        got = list(log.replay(stream, page=3))
        assert [i for i, _ in got] == ids
        assert [e for _, e in got] == sent

    def test_replay_from_a_position_is_exclusive(self, log: EventLog) -> None:
        stream = log.keys.facts(log.keys.cluster)
        ids = log.append_batch(stream, [env(registered(f"tm-{i}")) for i in range(5)])
        assert [i for i, _ in log.replay(stream, ids[1], page=2)] == ids[2:]
        assert list(log.replay(stream, ids[-1])) == []
        assert list(log.replay("{nothing}:facts")) == []

    # --- commit: atomic, fenced, idempotent -----------------------------------------------

    def test_commit_appends_to_several_streams_of_one_tag(self, log: EventLog) -> None:
        tag = log.keys.cluster
        facts, outbox = log.keys.facts(tag), log.keys.outbox(tag)
        target = log.keys.inbox(log.keys.taskmanager("tm-1"))
        a, b = env(registered("tm-1"), epoch=1), env(heartbeat(), epoch=1)
        result = log.commit(tag, 1, [Out(facts, a), Out(outbox, b, to=target)])
        assert not result.duplicate and len(result.ids) == 2
        assert [e for _, e in log.replay(facts)] == [a]
        ((_, fields),) = list(log.replay_raw(outbox))
        assert fields[b"to"].decode() == target and decode(fields[FIELD]) == b

    def test_commit_refuses_a_stale_epoch_and_writes_nothing(self, log: EventLog) -> None:
        tag = log.keys.cluster
        facts = log.keys.facts(tag)
        log.commit(tag, 2, [Out(facts, env(registered("a"), epoch=2))])
        with pytest.raises(StaleEpoch) as info:
            log.commit(tag, 1, [Out(facts, env(registered("b"), epoch=1))])
        assert info.value.epoch == 1 and info.value.current == 2
        assert "step down" in str(info.value) and tag in str(info.value)
        assert [e.event.resource_id for _, e in log.replay(facts)] == ["a"]

    def test_fence_claims_a_tag_for_a_new_epoch(self, log: EventLog) -> None:
        tag = log.keys.job("j1")
        facts = log.keys.facts(tag)
        log.commit(tag, 3, [Out(facts, env(registered("a"), epoch=3))])
        assert log.fence(tag, 4) == 4
        with pytest.raises(StaleEpoch):
            log.commit(tag, 3, [Out(facts, env(registered("b"), epoch=3))])
        with pytest.raises(StaleEpoch):
            log.fence(tag, 2)

    def test_a_snapshot_covers_the_facts_there_are_and_is_fenced(self, log: EventLog) -> None:
        tag = log.keys.job("j1")
        facts = log.keys.facts(tag)
        snaps = Snapshots(log)
        assert snaps.read(tag) is None
        assert snaps.write(tag, 3, b"empty") == "0-0"
        (last,) = log.commit(tag, 3, [Out(facts, env(registered("a"), epoch=3))]).ids
        assert snaps.write(tag, 3, b"one") == last
        stored = snaps.read(tag)
        assert stored is not None and (stored.position, stored.data) == (last, b"one")
        log.fence(tag, 4)
        with pytest.raises(StaleEpoch):  # a deposed leader writes no snapshot
            snaps.write(tag, 3, b"stale")
        stored = snaps.read(tag)
        assert stored is not None and stored.data == b"one"
        with pytest.raises(StoreRestarted):
            snaps.write(tag, 4, b"x", server="0" * 40)

    def test_commit_acknowledges_the_inbox_entry_and_a_redelivery_is_a_no_op(self, log: EventLog) -> None:
        tag = log.keys.cluster
        inbox, facts = log.keys.inbox(tag), log.keys.facts(tag)
        log.append(inbox, env(register()))
        consumer = GroupConsumer(log, inbox, "jm", "c1")
        (entry,) = consumer.read(block_ms=None)
        consumed = Consumed(inbox, "jm", entry.id)
        first = log.commit(tag, 1, [Out(facts, env(registered("tm-1"), epoch=1))], consumed)
        again = log.commit(tag, 1, [Out(facts, env(registered("tm-1"), epoch=1))], consumed)
        assert not first.duplicate and again.duplicate
        assert log.length(facts) == 1
        assert pending(log, inbox) == 0

    def test_one_commit_can_acknowledge_several_entries_or_none_if_one_was_done(self, log: EventLog) -> None:
        tag = log.keys.cluster
        inbox, facts = log.keys.inbox(tag), log.keys.facts(tag)
        log.append_batch(inbox, [env(heartbeat()) for _ in range(4)])
        entries = GroupConsumer(log, inbox, "jm", "c1").read(block_ms=None)
        ids = tuple(e.id for e in entries)
        assert not log.commit(tag, 1, [Out(facts, env(registered("a")))], Consumed(inbox, "jm", ids[:2])).duplicate
        # A batch holding an entry that is already done changes nothing, not even the others.
        again = log.commit(tag, 1, [Out(facts, env(registered("b")))], Consumed(inbox, "jm", ids[1:]))
        assert again.duplicate and log.length(facts) == 1
        assert pending(log, inbox) == 2
        assert not log.commit(tag, 1, [Out(facts, env(registered("c")))], Consumed(inbox, "jm", ids[2:])).duplicate
        assert pending(log, inbox) == 0

    def test_a_commit_never_spans_two_tags(self, log: EventLog) -> None:
        other = log.keys.facts(log.keys.job("j1"))
        with pytest.raises(StoreError, match="one hash tag"):
            log.commit(log.keys.cluster, 1, [Out(other, env(registered("a")))])
        assert log.length(other) == 0

    # --- consumers: pending, reclaim, dead letters ------------------------------------------

    def test_a_restarted_consumer_gets_its_own_pending_entries(self, log: EventLog) -> None:
        inbox = log.keys.inbox(log.keys.cluster)
        log.append_batch(inbox, [env(heartbeat()) for _ in range(3)])
        assert len(GroupConsumer(log, inbox, "jm", "c1").read(block_ms=None)) == 3
        again = GroupConsumer(log, inbox, "jm", "c1")  # same name, new process
        assert len(again.read(block_ms=None)) == 0
        assert len(again.pending()) == 3

    def test_read_counts_are_the_last_reads_whatever_recovery_reads_between(self, log: EventLog) -> None:
        """``read_counts`` (how far the last read got in each stream: the leader's "caught up")
        are the last ``read``'s: recovering another stream's pending entries in between (a
        job that joins while the leader handles a batch) must not change them."""
        cluster, job = log.keys.inbox(log.keys.cluster), log.keys.inbox(log.keys.job("j1"))
        log.append_batch(cluster, [env(heartbeat()) for _ in range(3)])
        log.append_batch(job, [env(heartbeat()) for _ in range(2)])
        GroupConsumer(log, job, "jm", "old").read(block_ms=None)  # an earlier leader's, left pending
        consumer = GroupConsumer(log, [cluster], "jm", "c1")
        assert len(consumer.read(count=2, block_ms=None)) == 2
        assert consumer.read_counts == {cluster: 2}  # not read to its end
        consumer.add_stream(job)
        assert len(consumer.recover(streams=[job])) == 2
        assert consumer.read_counts == {cluster: 2}

    def test_entries_left_pending_by_a_dead_consumer_are_reclaimed(self, log: EventLog) -> None:
        tag = log.keys.cluster
        inbox, facts = log.keys.inbox(tag), log.keys.facts(tag)
        sent = [env(register(f"tm-{i}")) for i in range(4)]
        log.append_batch(inbox, sent)
        dead = GroupConsumer(log, inbox, "jm", "dead")
        taken = dead.read(count=4, block_ms=None)
        assert len(taken) == 4  # ... and then the consumer dies without acknowledging
        alive = GroupConsumer(log, inbox, "jm", "alive")
        assert alive.read(block_ms=None) == []
        assert alive.reclaim(min_idle_ms=60_000) == []  # not idle long enough yet
        time.sleep(0.05)
        reclaimed = alive.reclaim(min_idle_ms=20, count=2)  # pages through all of them
        assert [e.envelope for e in reclaimed] == sent
        for e in reclaimed:
            assert not log.commit(
                tag, 1, [Out(facts, env(registered(e.envelope.event.resource_id)))], Consumed(inbox, "jm", e.id)
            ).duplicate
        # The dead consumer comes back and tries to commit what it had read: a no-op.
        late = log.commit(tag, 1, [Out(facts, env(registered("x")))], Consumed(inbox, "jm", taken[0].id))
        assert late.duplicate
        assert log.length(facts) == 4

    def test_a_sole_reader_takes_over_what_another_read_in_stream_order(self, log: EventLog) -> None:
        """A deposed leader ("old") reads after the new one ("new") took over, before and
        after the new one's reads: each read of the sole reader returns the other's pending
        entries with its own, each once and in stream order, and says how many it took."""
        tag = log.keys.cluster
        inbox, other = log.keys.inbox(tag), log.keys.inbox(log.keys.job("j1"))
        sent = [env(register(f"tm-{i}")) for i in range(6)]
        new = GroupConsumer(log, [inbox, other], "jm", "new", sole=True)
        assert new.read(block_ms=None) == [] and new.taken_over == 0
        log.append_batch(inbox, sent[:2])
        old = GroupConsumer(log, inbox, "jm", "old")
        assert len(old.read(block_ms=None)) == 2  # read before the new leader's next read
        log.append_batch(inbox, sent[2:4])
        got = new.read(block_ms=None)
        assert [e.envelope for e in got] == sent[:4] and new.taken_over == 2
        new.ack(*[e.id for e in got])  # decided (a leader's commit acknowledges them)
        log.append_batch(inbox, sent[4:])
        assert len(old.read(block_ms=None)) == 2  # read after: the sole reader's next read takes them
        got = new.read(block_ms=None)
        assert [e.envelope for e in got] == sent[4:] and new.taken_over == 2
        new.ack(*[e.id for e in got])
        assert new.read(block_ms=None) == [] and new.taken_over == 0
        assert pending(log, inbox) == 0
        plain = GroupConsumer(log, inbox, "jm", "plain")  # not sole: reads only what is new
        log.append(inbox, sent[0])
        assert len(old.read(block_ms=None)) == 1
        assert plain.read(block_ms=None) == []

    def test_a_sole_reader_decides_what_was_pending_in_a_stream_it_begins_to_read_first(self, log: EventLog) -> None:
        """A leader that begins to read a job's inbox (the job registered again after Redis
        lost writes) finds an entry its own earlier life read and never decided: it comes
        before what was sent after it, though the same consumer holds it (simulated seed
        12165 with every fault on)."""
        cluster, job = log.keys.inbox(log.keys.cluster), log.keys.inbox(log.keys.job("j1"))
        sent = [env(register(f"tm-{i}")) for i in range(2)]
        log.append(job, sent[0])
        assert len(GroupConsumer(log, job, "jm", "jm-a").read(block_ms=None)) == 1  # an earlier life
        leader = GroupConsumer(log, [cluster], "jm", "jm-a", sole=True)
        assert leader.read(block_ms=None) == []
        leader.add_stream(job)
        log.append(job, sent[1])
        got = leader.read(block_ms=None)
        assert [e.envelope for e in got] == sent and leader.taken_over == 1
        leader.ack(*[e.id for e in got], stream=job)
        assert leader.read(block_ms=None) == [] and leader.taken_over == 0

    @pytest.mark.parametrize(
        "fields, kind, says",
        [
            ({b"e": b"{not json"}, "not JSON", "unexpected character"),
            ({b"x": b"1"}, "malformed envelope", "no 'e' field"),
            (
                {b"e": b'{"type":"Bogus","v":1,"id":"i","job":null,"epoch":0,"ts":0,"cause":null,"payload":{}}'},
                "unknown event type",
                "'Bogus'",
            ),
            (
                {
                    b"e": b'{"type":"TaskManagerHeartbeat","v":1,"id":"i","job":null,"epoch":0,"ts":0,"cause":null,'
                    b'"payload":{"resource_id":"a","session":"s","epoch":1}}'
                },
                "missing field",
                "'slots_free'",
            ),
            (
                {
                    b"e": b'{"type":"TaskManagerHeartbeat","v":1,"id":"i","job":null,"epoch":0,"ts":0,"cause":null,'
                    b'"payload":{"resource_id":"a","session":"s","epoch":"1","slots_free":0}}'
                },
                "wrong field type",
                "'epoch'",
            ),
            (
                {
                    b"e": b'{"type":"TaskManagerHeartbeat","v":9,"id":"i","job":null,"epoch":0,"ts":0,"cause":null,'
                    b'"payload":{}}'
                },
                "unsupported schema version",
                "newer Sluice",
            ),
        ],
    )
    def test_undecodable_entries_are_dead_lettered_with_the_reason_and_reading_goes_on(
        self, log: EventLog, fields: dict, kind: str, says: str
    ) -> None:
        tag = log.keys.cluster
        inbox = log.keys.inbox(tag)
        seen: list = []
        good = env(heartbeat())
        log.backend.xadd(inbox, fields)
        log.append(inbox, good)
        consumer = GroupConsumer(log, inbox, "jm", "c1", on_dead_letter=lambda *a: seen.append(a))
        entries = consumer.read(block_ms=None)
        assert [e.envelope for e in entries] == [good]
        ((_, dead_fields),) = list(log.replay_raw(log.keys.dead(tag)))
        assert dead_fields[b"kind"].decode() == kind
        assert says in dead_fields[b"reason"].decode()
        assert dead_fields[b"stream"].decode() == inbox
        for k, v in fields.items():  # the entry is kept as it was: nothing is lost
            assert dead_fields[b"field:" + k] == v
        assert len(seen) == 1 and inbox in str(seen[0][2])
        assert pending(log, inbox) == 1  # only the good one, not yet acked

    @pytest.mark.parametrize("how", ["deleted", "clobbered"])
    def test_an_undecodable_entry_whose_inbox_went_since_it_was_read_is_parked_all_the_same(
        self, log: EventLog, how: str
    ) -> None:
        """The inbox deleted (or clobbered) between the read that found a bad entry and its
        dead-lettering: the script's XPENDING answers NOGROUP (WRONGTYPE); nothing is left
        to acknowledge, and the entry is parked all the same (a clobbered inbox set aside
        and made again), and reading goes on."""
        inbox = log.keys.inbox(log.keys.taskmanager("tm-1"))
        log.backend.xadd(inbox, {b"junk": b"1"})

        class Gone(Delegating):
            def around(self, name: str, call: Any) -> Any:
                if name == "script:dead_letter" and not self.inner.exists(inbox + ":done"):
                    self.inner.set(inbox + ":done", b"1")
                    self.inner.delete(inbox)
                    if how == "clobbered":
                        self.inner.set(inbox, b"someone else's")
                return call()

        told: list[tuple[str, str, str]] = []
        gone = EventLog(Gone(log.backend), log.keys)
        gone.on_set_aside = lambda *t: told.append(t)
        consumer = GroupConsumer(gone, inbox, "taskmanager", "tm-1")
        assert consumer.read(block_ms=None) == []
        ((_, parked),) = list(log.replay_raw(log.keys.dead(log.keys.taskmanager("tm-1"))))
        assert parked[b"stream"].decode() == inbox and parked[b"field:junk"] == b"1"
        assert [t[:2] for t in told] == ([(inbox, "string")] if how == "clobbered" else [])
        after = env(heartbeat())
        log.append(inbox, after)
        assert [e.envelope for e in consumer.read(block_ms=None)] == [after]

    @pytest.mark.parametrize("held", ["string", "hash"])
    def test_an_inbox_that_is_not_a_stream_is_set_aside_made_again_and_reading_goes_on(
        self, log: EventLog, held: str
    ) -> None:
        """One key among those read that holds another kind of value (WRONGTYPE fails a
        read of every stream with it: a leader reads every job's inbox in one call) is
        moved aside, kept as it was, and made again with the group; the others are read."""
        keys = log.keys
        cluster, job = keys.inbox(keys.cluster), keys.inbox(keys.job("j1"))
        told: list[tuple[str, str, str]] = []
        log.on_set_aside = lambda *t: told.append(t)
        consumer = GroupConsumer(log, [cluster, job], "jm", "c1")
        consumer.ensure_group()
        first = env(heartbeat())
        log.append(cluster, first)
        log.backend.delete(job)
        if held == "string":
            log.backend.set(job, b"someone else's")
        else:
            log.backend.hset(job, {"x": b"1"})
        assert [e.envelope for e in consumer.read(block_ms=None)] == [first]
        ((stream, kind, aside),) = told
        assert (stream, kind) == (job, held) and aside.startswith(job + ":not-a-stream:")
        assert tag_of(aside) == tag_of(job)
        if held == "string":
            assert log.backend.get(aside) == b"someone else's"
        else:
            assert log.backend.hgetall(aside) == {b"x": b"1"}
        later = env(heartbeat())
        log.append(job, later)
        assert [e.envelope for e in consumer.read(block_ms=None)] == [later]
        # A stream taken up later, and one whose pending entries are reclaimed: the same.
        other = keys.inbox(keys.job("j2"))
        log.backend.set(other, b"x")
        consumer.add_stream(other)
        assert told[-1][:2] == (other, "string")
        log.backend.delete(job)
        log.backend.set(job, b"y")
        assert [e.envelope for e in consumer.reclaim(min_idle_ms=0)] == [first]  # pending since the first read
        assert told[-1][:2] == (job, "string") and told[-1][2] != told[0][2]
        assert [e.envelope for e in consumer.read(block_ms=None)] == []
        assert len(told) == 3

    def test_a_commit_to_a_subtask_inbox_that_is_not_a_stream_moves_it_aside_and_goes_on(self, log: EventLog) -> None:
        """A commit that also writes into a subtask's inbox refused it (nothing written), and
        the leader rebuilt and decided the same message again, for ever: the value is moved
        aside and the commit goes again. A facts stream that is not one is not an inbox:
        that commit is still refused."""
        tag = log.keys.job("j1")
        facts, task, other = (
            log.keys.facts(tag),
            log.keys.task_inbox(tag, "src", 0),
            log.keys.task_inbox(tag, "src", 1),
        )
        told: list[tuple[str, str, str]] = []
        log.on_set_aside = lambda *t: told.append(t)
        log.backend.set(task, b"someone else's")
        log.backend.set(other, b"and another")
        e = env(heartbeat(), epoch=1)
        result = log.commit(tag, 1, [Out(facts, e), Out(task, e), Out(other, e)])  # both at once, not one a try
        assert not result.duplicate and [x for _, x in log.replay(task)] == [e] == [x for _, x in log.replay(facts)]
        assert [x for _, x in log.replay(other)] == [e]
        assert sorted(t[:2] for t in told) == sorted([(task, "string"), (other, "string")])
        assert log.backend.get(told[[t[0] for t in told].index(task)][2]) == b"someone else's"
        log.backend.delete(facts)
        log.backend.set(facts, b"x")
        with pytest.raises(ScriptError, match="not a stream|is a string"):
            log.commit(tag, 1, [Out(facts, e)])
        assert len(told) == 2

    def test_following_blocks_until_an_entry_arrives(self, log: EventLog) -> None:
        stream = log.keys.facts(log.keys.cluster)
        first = log.append(stream, env(registered("a")))
        timer = threading.Timer(0.1, lambda: log.append(stream, env(registered("b"))))
        timer.start()
        got = log.follow({stream: first}, block_ms=5000)
        timer.join()
        assert [decode(f[FIELD]).event.resource_id for _, _, f in got] == ["b"]

    def test_trimming_keeps_unprocessed_and_recent_entries(self, log: EventLog) -> None:
        inbox = log.keys.inbox(log.keys.cluster)
        log.append_batch(inbox, [env(heartbeat()) for _ in range(6)])
        c = GroupConsumer(log, inbox, "jm", "c1")
        done = c.read(count=4, block_ms=None)
        c.ack(*(e.id for e in done[:2]))
        far_future = int(time.time() * 1000) + 3_600_000
        assert log.trim_consumed(inbox, "jm", keep_ms=0, now_ms=far_future) == 2
        assert log.length(inbox) == 4
        assert len(c.pending()) == 2 and len(c.read(block_ms=None)) == 2
        assert log.trim_consumed(inbox, "jm", keep_ms=3_600_000, now_ms=int(time.time() * 1000)) == 0

    def test_an_outbox_is_trimmed_up_to_its_cursor_never_past_it(self, log: EventLog) -> None:
        tag = log.keys.job("j1")
        outbox, target = log.keys.outbox(tag), log.keys.inbox(log.keys.taskmanager("tm-1"))
        res = log.commit(tag, 1, [Out(outbox, env(heartbeat(rid=f"r{i}")), to=target) for i in range(5)])
        far_future = int(time.time() * 1000) + 3_600_000
        assert log.trim_delivered(tag, keep_ms=0, now_ms=far_future) == 0  # no cursor: nothing delivered
        log.backend.set(log.keys.outbox_cursor(tag), res.ids[2].encode())  # 0..2 delivered
        assert log.trim_delivered(tag, keep_ms=3_600_000, now_ms=int(time.time() * 1000)) == 0  # all recent
        assert log.trim_delivered(tag, keep_ms=0, now_ms=far_future) == 2
        assert [i for i, _ in log.replay_raw(outbox)] == list(res.ids[2:])  # the cursor's own entry stays
        assert Deliverer(log, tag).deliver() == 2  # recovery delivers the rest from the cursor
        assert log.length(target) == 2

    def test_a_read_stream_is_trimmed_through_the_last_entry_read_and_keeps_what_came_after(
        self, log: EventLog
    ) -> None:
        stream = log.keys.task_inbox(log.keys.job("j1"), "src", 0)
        ids = log.append_batch(stream, [env(heartbeat()) for _ in range(3)])
        later = log.append(stream, env(heartbeat()))  # appended after the reader's last look
        far_future = int(time.time() * 1000) + 3_600_000
        assert log.trim_read(stream, ids[-1], keep_ms=0, now_ms=far_future) == 3
        assert [i for i, _ in log.replay_raw(stream)] == [later]
        assert log.trim_read("{nothing}:inbox", ids[-1], keep_ms=0, now_ms=far_future) == 0

    def test_hdel_and_scan_keys(self, log: EventLog) -> None:
        b, tag = log.backend, log.keys.job("j1")
        b.hset(log.keys.delivered(tag), {"a": b"1", "b": b"2"})
        assert b.hdel(log.keys.delivered(tag), "a", "zz") == 1 and b.hdel("{nothing}:delivered", "a") == 0
        assert b.hkeys(log.keys.delivered(tag)) == [b"b"]
        assert b.hdel(log.keys.delivered(tag), "b") == 1 and not b.exists(log.keys.delivered(tag))
        log.append(log.keys.inbox(tag), env(heartbeat()))
        b.set(log.keys.fence(tag), b"1")
        b.set(log.keys.fence(log.keys.job("j10")), b"1")  # another job whose id begins alike
        assert sorted(b.scan_keys(log.keys.tag_pattern(tag))) == sorted([log.keys.inbox(tag), log.keys.fence(tag)])

    def test_a_tags_transport_and_then_all_its_keys_are_deleted_and_a_tombstone_stays(self, log: EventLog) -> None:
        from sluice.store.purge import Tombstones, delete_tag, forget_deliveries, release_transport

        keys, tag, other = log.keys, log.keys.job("j1"), log.keys.taskmanager("tm-1")
        task = keys.task_inbox(tag, "src", 0)
        for stream in (keys.inbox(tag), keys.outbox(tag), task, keys.facts(tag)):
            log.append(stream, env(heartbeat()))
        log.backend.set(keys.outbox_cursor(tag), b"1-0")
        log.backend.hset(keys.delivered(other), {keys.outbox(tag): b"1-0", "else": b"1-0"})
        assert release_transport(log, tag, [task]) == 4
        assert log.backend.scan_keys(keys.tag_pattern(tag)) == [keys.facts(tag)]  # the facts stay
        # The outbox's mark stays until a purge: a late deliverer's page is dropped by it.
        assert sorted(log.backend.hkeys(keys.delivered(other))) == sorted([keys.outbox(tag).encode(), b"else"])
        forget_deliveries(log, tag, [other])
        assert log.backend.hkeys(keys.delivered(other)) == [b"else"]
        assert delete_tag(log, tag) == 1 and log.backend.scan_keys(keys.tag_pattern(tag)) == []
        Tombstones(log).write("j1", {"status": "FINISHED", "purged_at": 5})
        assert Tombstones(log).read("j1") == {"status": "FINISHED", "purged_at": 5}
        assert Tombstones(log).read("j2") is None and list(Tombstones(log).all()) == ["j1"]

    def test_a_page_read_before_its_outbox_was_released_is_not_delivered_again(self, log: EventLog) -> None:
        """A deliverer (a deposed leader, recovery racing the leader) reads a page of a job's
        outbox; meanwhile the leader delivers it all and archives the job (its transport
        released); the late deliverer then hands its page over: the marks the outbox left in
        the target drop it (simulated seeds 11076 and 11458 of --all-faults on 38b6f48, when
        the release forgot the marks: delivered twice)."""
        from sluice.store.purge import release_transport

        tag = log.keys.job("j1")
        outbox, target = log.keys.outbox(tag), log.keys.inbox(log.keys.taskmanager("tm-1"))
        log.commit(tag, 1, [Out(outbox, env(heartbeat(rid=f"r{i}")), to=target) for i in range(3)])

        class ReleasedMeanwhile(Delegating):
            done = False

            def xrange(self, stream: str, after: str | None, count: int) -> Any:
                page = self.inner.xrange(stream, after, count)
                if stream == outbox and page and not self.done:
                    self.done = True
                    assert Deliverer(log, tag).deliver() == 3  # the leader delivers it all...
                    release_transport(log, tag)  # ...and archives the job
                return page

        late = Deliverer(EventLog(ReleasedMeanwhile(log.backend), log.keys), tag)
        assert late.deliver() == 0
        assert log.length(target) == 3 and not log.backend.exists(outbox)

    def test_trimming_an_inbox_overwritten_meanwhile_trims_nothing(self, log: EventLog) -> None:
        """Overwritten between the trim's look at its group and its XTRIM: the inbox's reader
        moves it aside and makes it again, and the trim must not raise meanwhile (a
        TaskManager's tick did: simulated seed 886 with every fault on)."""
        inbox = log.keys.inbox(log.keys.cluster)
        log.append_batch(inbox, [env(heartbeat()) for _ in range(2)])
        c = GroupConsumer(log, inbox, "jm", "c1")
        c.ack(*(e.id for e in c.read(block_ms=None)))

        class OverwriteAfterLook(Delegating):
            def group_state(self, stream: str, group: str) -> GroupState | None:
                state = self.inner.group_state(stream, group)
                self.inner.delete(stream)
                self.inner.set(stream, b"someone else's")
                return state

        far_future = int(time.time() * 1000) + 3_600_000
        raced = EventLog(OverwriteAfterLook(log.backend), log.keys)
        assert raced.trim_consumed(inbox, "jm", keep_ms=0, now_ms=far_future) == 0
        assert log.trim_consumed(inbox, "jm", keep_ms=0, now_ms=far_future) == 0  # overwritten before the look
        assert log.backend.get(inbox) == b"someone else's"

    # --- leadership --------------------------------------------------------------------------

    def test_the_lease_has_one_holder_and_every_takeover_raises_the_epoch(self, log: EventLog) -> None:
        a, b = LeaderLease(log, "a", 200), LeaderLease(log, "b", 200)
        assert a.try_acquire() == 1
        assert b.try_acquire() is None
        assert a.try_acquire() == 1 and a.renew()
        assert a.current().holder == "a"
        time.sleep(0.3)
        assert b.try_acquire() == 2
        assert not a.renew()
        with pytest.raises(StaleEpoch):  # the deposed leader cannot write any more
            log.commit(log.keys.cluster, 1, [Out(log.keys.facts(log.keys.cluster), env(registered("x")))])
        b.release()
        assert a.try_acquire() == 3

    # --- outbox ------------------------------------------------------------------------------

    def test_outbox_entries_are_delivered_once_even_when_delivery_repeats(self, log: EventLog) -> None:
        tag = log.keys.cluster
        target_tag = log.keys.taskmanager("tm-1")
        target = log.keys.inbox(target_tag)
        replies = [env(heartbeat(), epoch=1) for _ in range(3)]
        log.commit(tag, 1, [Out(log.keys.outbox(tag), r, to=target) for r in replies])
        # A delivery that crashed after appending the first reply but before acknowledging it:
        (first_id, first_fields), *_ = list(log.replay_raw(log.keys.outbox(tag)))
        log.backend.script(
            "deliver",
            [target, log.keys.delivered(target_tag)],
            ["", log.keys.outbox(tag), first_id, first_fields[FIELD]],
        )
        d = Deliverer(log, tag)
        assert d.deliver() == 2  # the first one was already there
        assert d.deliver() == 0
        assert [e for _, e in log.replay(target)] == replies

    def test_two_deliverers_racing_over_a_long_outbox_deliver_every_entry_once(self, log: EventLog) -> None:
        """Bug 1: one deliverer pauses after reading its first batch; another delivers the
        whole outbox meanwhile; the first resumes. Before, the first's batch was dropped as
        'already delivered' and acknowledged: 700 entries, 200 delivered."""
        tag = log.keys.job("j1")
        target = log.keys.inbox(log.keys.taskmanager("tm-1"))
        sent = [env(heartbeat(rid=f"tm-{i}"), epoch=1) for i in range(700)]
        for i in range(0, 700, 100):
            log.commit(tag, 1, [Out(log.keys.outbox(tag), e, to=target) for e in sent[i : i + 100]])
        other = Deliverer(EventLog(log.backend, log.keys), tag)

        class PauseAfterFirstRead(Delegating):
            paused = False

            def around(self, name, call):
                result = call()
                if name == "xrange" and not self.paused:
                    self.paused = True  # the new leader delivers everything while we are paused
                    assert other.deliver(batch=250) == 700
                return result

        first = Deliverer(EventLog(PauseAfterFirstRead(log.backend), log.keys), tag)
        assert first.deliver(batch=500) == 0  # all of it was delivered, once, by the other
        assert [e for _, e in log.replay(target)] == sent
        assert first.deliver() == 0 and other.deliver() == 0
        more = env(heartbeat(rid="late"), epoch=1)
        log.commit(tag, 1, [Out(log.keys.outbox(tag), more, to=target)])
        assert first.deliver() == 1 and other.deliver() == 0
        assert log.length(target) == 701

    def test_a_deliverer_starts_where_it_left_the_cursor_and_stays_exact_behind_another(self, log: EventLog) -> None:
        """Naming the server, a deliverer remembers the cursor it left and does not read it
        again; when another deliverer has moved the cursor on meanwhile, starting behind it
        hands the targets only entries their marks drop. Without a server named, or after
        an error, it reads the cursor."""
        tag = log.keys.job("j1")
        target = log.keys.inbox(log.keys.taskmanager("tm-1"))
        server = log.server_id()

        counting = Counting(log.backend)
        mine = Deliverer(EventLog(counting, log.keys), tag)
        other = Deliverer(EventLog(log.backend, log.keys), tag)
        sent = [env(heartbeat(rid=f"tm-{i}"), epoch=1) for i in range(9)]
        log.commit(tag, 1, [Out(log.keys.outbox(tag), e, to=target) for e in sent[:3]])
        assert mine.deliver(server=server) == 3
        assert counting.calls.count("get") == 1
        log.commit(tag, 1, [Out(log.keys.outbox(tag), e, to=target) for e in sent[3:6]])
        assert other.deliver(server=server) == 3  # the cursor moves past what mine remembers
        log.commit(tag, 1, [Out(log.keys.outbox(tag), e, to=target) for e in sent[6:]])
        assert mine.deliver(server=server) == 3  # from its own cursor: 3..5 dropped by the mark, 6..8 new
        assert counting.calls.count("get") == 1  # the cursor was not read again
        assert [e for _, e in log.replay(target)] == sent
        assert mine.deliver() == 0 and counting.calls.count("get") == 2  # no server named: read
        assert mine.deliver(server=server) == 0 and counting.calls.count("get") == 2  # remembered again
        late = env(heartbeat(rid="late"), epoch=1)
        log.commit(tag, 1, [Out(log.keys.outbox(tag), late, to=target)])
        with pytest.raises(StoreRestarted):
            mine.deliver(server="another-run-id")  # reads the cursor (another server), then refused
        assert mine.deliver(server=server) == 1 and counting.calls.count("get") == 4  # dropped at the error
        assert [e for _, e in log.replay(target)] == [*sent, late]

    def test_appending_to_several_streams_refuses_only_a_key_that_is_not_a_stream(self, log: EventLog) -> None:
        """``xadd_many`` is one transaction: the keys that are streams (or none yet) take their
        entries, in order; one that holds another kind of value refuses its own
        (PartlyAppended: the ids, None in its place); an entry Redis refuses before running
        anything (no fields) appends none."""
        from sluice.errors import PartlyAppended

        b = log.backend
        tag = log.keys.cluster
        a, table, c = log.keys.inbox(tag), log.keys.table(tag, "t"), log.keys.facts(tag)
        b.hset(table, {"x": b"1"})
        with pytest.raises(PartlyAppended) as refused:
            b.xadd_many([(a, {b"n": b"1"}), (table, {b"n": b"2"}), (c, {b"n": b"3"}), (a, {b"n": b"4"})])
        ids = refused.value.ids
        assert ids[1] is None and list(refused.value.errors) == [1] and "WRONGTYPE" in refused.value.errors[1]
        assert [i for i, _ in b.xrange(a, None, 10)] == [ids[0], ids[3]] and [i for i, _ in b.xrange(c, None, 10)] == [
            ids[2]
        ]
        assert b.hgetall(table) == {b"x": b"1"}
        with pytest.raises(Exception, match="wrong number of arguments"):
            b.xadd_many([(a, {b"n": b"5"}), (c, {})])
        assert b.xlen(a) == 2 and b.xlen(c) == 1

    def test_a_commit_carries_the_outbox_cursor_forward_never_back_and_refuses_a_bad_one_before_writing(
        self, log: EventLog
    ) -> None:
        b = log.backend
        tag = log.keys.job("j1")
        fence, inbox, facts, cursor = (
            log.keys.fence(tag),
            log.keys.inbox(tag),
            log.keys.facts(tag),
            log.keys.outbox_cursor(tag),
        )
        log.commit(tag, 1, [Out(facts, env(heartbeat(), epoch=1))], advance="5-0")
        assert b.get(cursor) == b"5-0"
        log.commit(tag, 1, [Out(facts, env(heartbeat(), epoch=1))], advance="3-7")
        assert b.get(cursor) == b"5-0"  # never back
        log.commit(tag, 1, [], advance="5-1")  # a commit of nothing else moves it too
        assert b.get(cursor) == b"5-1"
        with pytest.raises(StaleEpoch):
            log.commit(tag, 0, [Out(facts, env(heartbeat(), epoch=0))], advance="9-0")
        assert b.get(cursor) == b"5-1"
        # Refused before anything is written: the fence named as the cursor, a cursor beyond
        # the keys, an id that is not one, no index, an index that is not a whole number, a
        # stream the commit appends to. The consumed entry stays pending, no fact is added.
        entry = b.xadd(inbox, {b"n": b"1"})
        b.group_create(inbox, "jm", "0")
        b.xreadgroup("jm", "c", {inbox: ">"}, count=10, block_ms=None)
        for ci, upto in ((1, "9-0"), (5, "9-0"), (4, "not-an-id"), ("", ""), ("3.5", "9-0"), (3, "9-0")):
            with pytest.raises(ScriptFailed, match="^SLUICE_BAD_COMMIT"):
                b.script("commit", [fence, inbox, facts, cursor], [1, "", "jm", 1, entry, ci, upto, 3, b"x", ""])
        assert b.xlen(facts) == 2 and _pending(b, inbox, "jm") == 1 and b.get(fence) == b"1"
        # A cursor key holding another kind of value is left alone; the commit goes through.
        b.delete(cursor)
        b.hset(cursor, {"x": b"1"})
        assert log.commit(
            tag, 1, [Out(facts, env(heartbeat(), epoch=1))], Consumed(inbox, "jm", (entry,)), advance="9-0"
        ).ids
        assert b.hgetall(cursor) == {b"x": b"1"} and _pending(b, inbox, "jm") == 0

    def test_a_lazy_delivery_owes_the_cursor_move_to_the_next_commit_or_a_flush(self, log: EventLog) -> None:
        """Delivering lazily hands the entries over at once but leaves the cursor where it
        was; the tag's next commit moves it (no round trip of its own), or a flush does. A
        deliverer starting from the cursor meanwhile hands over only what the marks drop."""
        tag = log.keys.job("j1")
        outbox, target = log.keys.outbox(tag), log.keys.inbox(log.keys.taskmanager("tm-1"))
        cursor, server = log.keys.outbox_cursor(tag), log.server_id()
        counting = Counting(log.backend)
        mine = Deliverer(EventLog(counting, log.keys), tag)
        sent = [env(heartbeat(rid=f"tm-{i}"), epoch=1) for i in range(4)]
        first = log.commit(tag, 1, [Out(outbox, e, to=target) for e in sent[:2]], server=server)
        assert mine.deliver(server=server, committed=first, lazy=True) == 2
        assert log.backend.get(cursor) is None and mine.owed == (server, first.ids[-1])
        assert "script:advance_cursor" not in counting.calls
        assert Deliverer(log, tag).deliver(server=server, lazy=True) == 0  # from the cursor: all dropped
        assert mine.carry("another-run-id") is None
        carried = mine.carry(server)
        second = log.commit(tag, 1, [Out(outbox, sent[2], to=target)], server=server, advance=carried)
        mine.carried(carried or "")
        assert log.backend.get(cursor) == first.ids[-1].encode() and mine.owed is None
        assert mine.deliver(server=server, committed=second, lazy=True) == 1  # its cursor is where the commit began
        assert counting.calls.count("xrange") == 1  # read back only the first time (it knew no cursor)
        mine.flush()
        assert log.backend.get(cursor) == second.ids[-1].encode() and mine.owed is None
        assert counting.calls.count("script:advance_cursor") == 1
        mine.flush()  # nothing owed: no round trip
        assert counting.calls.count("script:advance_cursor") == 1
        third = log.commit(tag, 1, [Out(outbox, sent[3], to=target)], server=server)
        mine.deliver(server=server, committed=third, lazy=True)
        mine.owed = ("another-run-id", third.ids[-1])  # as if owed on a server that restarted since
        with pytest.raises(StoreRestarted):
            mine.flush()
        assert mine.owed is None and log.backend.get(cursor) == second.ids[-1].encode()
        assert [e for _, e in log.replay(target)] == sent

    def test_a_commit_is_delivered_without_reading_the_outbox_back_only_when_nothing_precedes_it(
        self, log: EventLog
    ) -> None:
        """After a commit, a deliverer whose cursor is where the outbox ended before it hands
        over the commit's own entries from the commit's result (no XRANGE). When entries it
        has not delivered precede them (another leader's, left undelivered), it reads the
        outbox: those are delivered too, first, never skipped."""
        tag = log.keys.job("j1")
        outbox = log.keys.outbox(tag)
        target = log.keys.inbox(log.keys.taskmanager("tm-1"))
        server = log.server_id()
        counting = Counting(log.backend)
        mine_log = EventLog(counting, log.keys)
        mine = Deliverer(mine_log, tag)
        sent = [env(heartbeat(rid=f"tm-{i}"), epoch=1) for i in range(9)]

        def commit(envs: list[Envelope], via: EventLog) -> Any:
            return via.commit(tag, 1, [Out(outbox, e, to=target) for e in envs], server=server)

        first = commit(sent[:2], mine_log)
        assert first.outbox == outbox and first.before == "" and [a[0] for a in first.addressed] == list(first.ids)
        assert (
            mine.deliver(committed=first, server=server) == 2 and counting.calls.count("xrange") == 1
        )  # no cursor yet
        second = commit(sent[2:4], mine_log)
        assert second.before == first.ids[-1]
        assert mine.deliver(committed=second, server=server) == 2
        assert counting.calls.count("xrange") == 1  # handed over from the result
        commit(sent[4:6], log)  # another writer's entries, not delivered
        third = commit(sent[6:8], mine_log)
        assert mine.deliver(committed=third, server=server) == 4  # read back: theirs first, then its own
        assert counting.calls.count("xrange") == 2
        assert [e for _, e in log.replay(target)] == sent[:8]
        late = commit(sent[8:], mine_log)
        assert mine.deliver(committed=late, server="") == 1  # no server named: it reads
        assert counting.calls.count("xrange") == 3
        assert mine.deliver(committed=late, server=server) == 0  # a repeat changes nothing
        assert [e for _, e in log.replay(target)] == sent
        assert log.backend.get(log.keys.outbox_cursor(tag)) == late.ids[-1].encode()

    @pytest.mark.parametrize("bad", ["no-tag-at-all", "{x:client:c1}:inbox"])
    def test_an_undeliverable_entry_is_parked_and_the_rest_of_the_outbox_is_delivered(
        self, log: EventLog, bad: str
    ) -> None:
        """Bug 3: a reply address with no hash tag, or of another cluster, used to raise in
        every delivery, forever."""
        tag = log.keys.cluster
        good = log.keys.inbox(log.keys.taskmanager("tm-1"))
        parked: list = []
        a, b, c = (env(heartbeat(), epoch=1) for _ in range(3))
        log.commit(
            tag,
            1,
            [
                Out(log.keys.outbox(tag), a, to=good),
                Out(log.keys.outbox(tag), b, to=bad),
                Out(log.keys.outbox(tag), c, to=good),
            ],
        )
        d = Deliverer(log, tag, on_undeliverable=lambda *x: parked.append(x))
        assert d.deliver() == 2
        assert [e for _, e in log.replay(good)] == [a, c]
        ((_, dead),) = list(log.replay_raw(log.keys.dead(tag)))
        assert dead[b"kind"] == b"undeliverable" and bad.encode() in dead[b"field:to"]
        assert decode(dead[b"field:e"]) == b
        assert len(parked) == 1 and d.deliver() == 0

    def test_a_page_for_several_targets_is_delivered_in_one_round_trip_past_a_bad_target(self, log: EventLog) -> None:
        """One page of the outbox addresses four TaskManagers and an inbox of another cluster:
        the four get their entries, in outbox order, with one call to the server for all
        the deliveries; the bad one's entries are parked; the cursor moves past the page."""
        tag = log.keys.cluster
        goods = [log.keys.inbox(log.keys.taskmanager(f"tm-{i}")) for i in range(4)]
        bad = "{x:client:c1}:inbox"
        sent = [env(heartbeat(rid=f"tm-{i}"), epoch=1) for i in range(20)]
        targets = [goods[i % 4] if i % 5 else bad for i in range(20)]
        log.commit(tag, 1, [Out(log.keys.outbox(tag), e, to=t) for e, t in zip(sent, targets)])

        counting = Counting(log.backend)
        parked: list = []
        d = Deliverer(EventLog(counting, log.keys), tag, on_undeliverable=lambda *x: parked.append(x))
        assert d.deliver() == 16
        assert counting.calls.count("script_many") == 1 and "script:deliver" not in counting.calls
        for good in goods:
            assert [e for _, e in log.replay(good)] == [e for e, t in zip(sent, targets) if t == good]
        dead = [f for _, f in log.replay_raw(log.keys.dead(tag))]
        assert [decode(f[b"field:e"]) for f in dead] == [e for e, t in zip(sent, targets) if t == bad]
        assert all(f[b"kind"] == b"undeliverable" and b"x:client:c1" in f[b"reason"] for f in dead)
        assert len(parked) == 4
        last = list(log.replay_raw(log.keys.outbox(tag)))[-1][0]
        assert log.backend.get(log.keys.outbox_cursor(tag)) == last.encode()
        assert d.deliver() == 0 and Deliverer(log, tag).deliver() == 0  # nothing again, nothing parked again
        assert sum(log.length(g) for g in goods) == 16 and log.length(log.keys.dead(tag)) == 4

    def test_an_inbox_that_is_not_a_stream_is_set_aside_and_delivered_to(self, log: EventLog) -> None:
        """Parking the entries for an inbox whose key holds another kind of value lost them
        for its reader (a job whose SubmitJob was parked never began): the value is moved
        aside, kept as it was, and the entries are delivered; the reader, finding no group,
        makes it at '0' and reads them."""
        tag = log.keys.cluster
        inbox = log.keys.inbox(log.keys.job("j1"))
        consumer = GroupConsumer(log, inbox, "jm", "c1")
        consumer.ensure_group()
        log.backend.delete(inbox)
        log.backend.hset(inbox, {"x": b"1"})
        sent = [env(heartbeat(), epoch=1) for _ in range(3)]
        log.commit(tag, 1, [Out(log.keys.outbox(tag), e, to=inbox) for e in sent])
        told: list[tuple[str, str, str]] = []
        log.on_set_aside = lambda *t: told.append(t)
        d = Deliverer(log, tag, on_undeliverable=lambda *x: pytest.fail(f"parked: {x}"))
        assert d.deliver() == 3
        ((stream, kind, aside),) = told
        assert (stream, kind) == (inbox, "hash") and log.backend.hgetall(aside) == {b"x": b"1"}
        assert [e.envelope for e in consumer.read(block_ms=None)] == sent
        assert d.deliver() == 0 and log.length(log.keys.dead(tag)) == 0

    def test_a_script_error_other_than_a_bad_target_moves_no_cursor(self, log: EventLog) -> None:
        tag = log.keys.cluster
        target = log.keys.inbox(log.keys.taskmanager("tm-1"))
        log.commit(tag, 1, [Out(log.keys.outbox(tag), env(heartbeat(), epoch=1), to=target)])
        with pytest.raises(StoreRestarted):
            Deliverer(log, tag).deliver(server="0" * 40)
        assert log.backend.get(log.keys.outbox_cursor(tag)) is None and log.length(target) == 0
        assert Deliverer(log, tag).deliver() == 1

    # --- restarts ---------------------------------------------------------------------------------

    def test_a_writer_that_has_not_seen_a_restart_is_refused(self, log: EventLog) -> None:
        tag = log.keys.cluster
        facts = log.keys.facts(tag)
        server = log.server_id()
        assert server and log.server_id() == server
        assert not log.commit(tag, 1, [Out(facts, env(registered("a")))], server=server).duplicate
        with pytest.raises(StoreRestarted) as info:
            log.commit(tag, 1, [Out(facts, env(registered("b")))], server="0" * 40)
        assert info.value.run_id == server and "rebuild" in str(info.value)
        with pytest.raises(StoreRestarted):
            log.fence(tag, 2, server="0" * 40)
        assert log.length(facts) == 1

    def test_one_commit_cannot_consume_an_entry_twice(self, log: EventLog) -> None:
        tag = log.keys.cluster
        inbox = log.keys.inbox(tag)
        log.append_batch(inbox, [env(heartbeat()) for _ in range(2)])
        (e1, e2) = GroupConsumer(log, inbox, "jm", "c1").read(block_ms=None)
        with pytest.raises(ScriptError, match="twice"):
            log.commit(tag, 1, [Out(log.keys.facts(tag), env(registered("a")))], Consumed(inbox, "jm", (e1.id, e1.id)))
        assert log.length(log.keys.facts(tag)) == 0 and pending(log, inbox) == 2

    def test_recovery_returns_each_entry_left_pending_once(self, log: EventLog) -> None:
        """Bug 2: a new leader reclaimed the old one's pending entries and then read them
        again as its own pending entries: every one was decided twice."""
        inbox = log.keys.inbox(log.keys.cluster)
        sent = [env(heartbeat(rid=f"tm-{i}")) for i in range(5)]
        log.append_batch(inbox, sent)
        assert len(GroupConsumer(log, inbox, "jm", "old").read(count=3, block_ms=None)) == 3
        new = GroupConsumer(log, inbox, "jm", "new")
        assert len(new.read(count=1, block_ms=None)) == 1  # its own, read before a crash
        got = new.recover(count=2)
        assert [e.envelope for e in got] == sent[:4]
        assert len({e.id for e in got}) == 4

    # --- read models --------------------------------------------------------------------------

    def test_read_model_rows_and_position_move_together_once(self, log: EventLog) -> None:
        tables = ReadModels(log)
        tag = log.keys.cluster
        assert tables.write(tag, "t", expected=None, position="1-0", rows={"a": {"n": 1}})
        assert not tables.write(tag, "t", expected=None, position="1-0", rows={"a": {"n": 99}})
        assert tables.write(tag, "t", expected="1-0", position="2-0", rows={"b": {"n": 2}}, deleted=("a",))
        assert tables.read(tag, "t") == ("2-0", {"b": {"n": 2}})

    # --- Redis semantics the simulation depends on (each one pinned on every backend) --------

    def _read_all(self, log: EventLog, stream: str, n: int, consumer: str = "a", group: str = "g") -> list[str]:
        ids = [log.backend.xadd(stream, {b"n": str(i).encode()}) for i in range(n)]
        log.backend.group_create(stream, group, "0")
        got = log.backend.xreadgroup(group, consumer, {stream: ">"}, count=n, block_ms=None)
        assert [i for _, i, _ in got] == ids
        return ids

    def test_entry_ids_come_from_the_server_clock_and_always_increase(self, log: EventLog) -> None:
        b = log.backend
        stream = log.keys.inbox(log.keys.cluster)
        before = b.time_ms()
        ids = [b.xadd(stream, {b"n": b"1"})] + b.xadd_many([(stream, {b"n": str(i).encode()}) for i in range(50)])
        after = b.time_ms()
        pairs = [tuple(int(p) for p in i.split("-")) for i in ids]
        assert pairs == sorted(set(pairs))
        assert before - 5 <= pairs[0][0] <= after + 5
        assert b.last_id(stream) == ids[-1] and b.xlen(stream) == 51
        assert b.last_id(log.keys.inbox(log.keys.job("none"))) is None

    def test_xautoclaim_pages_through_idle_entries_and_resets_their_idle_time(self, log: EventLog) -> None:
        b = log.backend
        stream = log.keys.inbox(log.keys.cluster)
        ids = self._read_all(log, stream, 5)
        assert b.xautoclaim(stream, "g", "b", min_idle_ms=60_000, start="0-0", count=100) == ("0-0", [])
        time.sleep(0.06)
        pages = []
        start = "0-0"
        while True:
            start, claimed = b.xautoclaim(stream, "g", "b", min_idle_ms=30, start=start, count=2)
            pages.append(([i for i, _ in claimed], start))
            if start == "0-0":
                break
        assert pages == [(ids[0:2], ids[2]), (ids[2:4], ids[4]), (ids[4:], "0-0")]
        assert all(
            f == {b"n": str(k).encode()}
            for k, (_, f) in enumerate(
                [c for p in [b.xautoclaim(stream, "g", "c", min_idle_ms=0, start="0-0", count=10)[1]] for c in p]
            )
        )
        # Claimed just now by c: nobody can take them as idle, and they are c's pending entries now.
        assert b.xautoclaim(stream, "g", "b", min_idle_ms=10_000, start="0-0", count=10) == ("0-0", [])
        assert [i for _, i, _ in b.xreadgroup("g", "c", {stream: "0"}, count=10, block_ms=None)] == ids
        assert b.xreadgroup("g", "a", {stream: "0"}, count=10, block_ms=None) == []
        assert b.group_state(stream, "g").pending == 5

    def test_xautoclaim_looks_at_ten_times_count_entries_at_most(self, log: EventLog) -> None:
        stream = log.keys.inbox(log.keys.cluster)
        ids = self._read_all(log, stream, 15)
        # None is idle: the scan stops after 10 x COUNT entries and says where to go on.
        assert log.backend.xautoclaim(stream, "g", "b", min_idle_ms=60_000, start="0-0", count=1) == (ids[10], [])
        assert log.backend.xautoclaim(stream, "g", "b", min_idle_ms=60_000, start=ids[10], count=1) == ("0-0", [])

    def test_xautoclaim_takes_only_entries_idle_long_enough(self, log: EventLog) -> None:
        b = log.backend
        stream = log.keys.inbox(log.keys.cluster)
        ids = [b.xadd(stream, {b"n": str(i).encode()}) for i in range(4)]
        b.group_create(stream, "g", "0")
        assert len(b.xreadgroup("g", "a", {stream: ">"}, count=2, block_ms=None)) == 2
        time.sleep(0.1)
        assert len(b.xreadgroup("g", "a", {stream: ">"}, count=2, block_ms=None)) == 2
        nxt, claimed = b.xautoclaim(stream, "g", "b", min_idle_ms=60, start="0-0", count=10)
        assert nxt == "0-0" and [i for i, _ in claimed] == ids[:2]

    def test_reading_own_pending_entries_again_resets_their_idle_time(self, log: EventLog) -> None:
        b = log.backend
        stream = log.keys.inbox(log.keys.cluster)
        ids = self._read_all(log, stream, 2)
        time.sleep(0.1)
        assert [i for _, i, _ in b.xreadgroup("g", "a", {stream: "0"}, count=1, block_ms=None)] == ids[:1]
        _, claimed = b.xautoclaim(stream, "g", "b", min_idle_ms=60, start="0-0", count=10)
        assert [i for i, _ in claimed] == ids[1:]

    def test_pending_entries_after_xack(self, log: EventLog) -> None:
        b = log.backend
        stream = log.keys.inbox(log.keys.cluster)
        ids = self._read_all(log, stream, 3)
        state = b.group_state(stream, "g")
        assert (state.last_delivered, state.pending, state.min_pending) == (ids[2], 3, ids[0])
        assert b.xack(stream, "g", [ids[1]]) == 1
        assert b.xack(stream, "g", [ids[1]]) == 0  # already done
        assert b.xack(stream, "g", [ids[0], ids[0], ids[1]]) == 1  # each pending entry counts once
        assert b.xack(stream, "other", [ids[2]]) == 0 and b.xack(log.keys.inbox(log.keys.job("x")), "g", ids) == 0
        state = b.group_state(stream, "g")
        assert (state.last_delivered, state.pending, state.min_pending) == (ids[2], 1, ids[2])
        assert [i for _, i, _ in b.xreadgroup("g", "a", {stream: "0"}, count=10, block_ms=None)] == ids[2:]
        assert b.xack(stream, "g", ids) == 1
        assert b.group_state(stream, "g") == GroupState(ids[2], 0, None)
        assert b.group_state(stream, "other") is None and b.group_state(log.keys.inbox(log.keys.job("x")), "g") is None

    def test_xreadgroup_with_an_id_returns_this_consumers_pending_entries_after_it(self, log: EventLog) -> None:
        b = log.backend
        stream, other = log.keys.inbox(log.keys.cluster), log.keys.facts(log.keys.cluster)
        ids = [b.xadd(stream, {b"n": str(i).encode()}) for i in range(5)]
        b.group_create(stream, "g", "0")
        b.group_create(other, "g", "0")
        assert len(b.xreadgroup("g", "a", {stream: ">"}, count=2, block_ms=None)) == 2
        assert len(b.xreadgroup("g", "b", {stream: ">"}, count=2, block_ms=None)) == 2
        assert len(b.xreadgroup("g", "a", {stream: ">"}, count=2, block_ms=None)) == 1

        def mine(consumer: str, after: str, count: int = 10) -> list[str]:
            got = b.xreadgroup("g", consumer, {stream: after}, count=count, block_ms=None)
            assert all(s == stream and f is not None for s, _, f in got)
            return [i for _, i, _ in got]

        assert mine("a", "0") == [ids[0], ids[1], ids[4]]
        assert mine("a", ids[0]) == [ids[1], ids[4]]
        assert mine("a", ids[1]) == [ids[4]] and mine("a", ids[4]) == []
        assert mine("a", "0", count=2) == ids[:2]
        assert mine("b", "0") == ids[2:4] and mine("nobody", "0") == []
        # Several streams in one call; each keeps its own position, new and pending mixed.
        b.xadd(other, {b"n": b"x"})
        got = b.xreadgroup("g", "b", {stream: ids[2], other: ">"}, count=10, block_ms=None)
        assert [(s, i) for s, i, _ in got][:1] == [(stream, ids[3])] and [s for s, _, _ in got][1:] == [other]
        with pytest.raises(NoGroup):
            b.xreadgroup("missing", "a", {stream: ">"}, count=1, block_ms=None)
        with pytest.raises(NoGroup):
            b.xreadgroup("g", "a", {log.keys.inbox(log.keys.job("x")): "0"}, count=1, block_ms=None)

    def test_a_read_acknowledges_what_it_is_given_first_and_a_refused_acknowledgement_hides_nothing(
        self, log: EventLog
    ) -> None:
        b = log.backend
        stream = log.keys.inbox(log.keys.taskmanager("tm-1"))
        b.group_create(stream, "g", "0")
        first = [b.xadd(stream, {b"n": b"1"}) for _ in range(3)]
        assert len(b.xreadgroup("g", "a", {stream: ">"}, count=10, block_ms=None)) == 3
        later = b.xadd(stream, {b"n": b"2"})
        got = b.xreadgroup("g", "a", {stream: ">"}, count=10, block_ms=None, ack={stream: first[:2]})
        assert [i for _, i, _ in got] == [later]
        assert _pending(b, stream, "g") == 2  # first[2] and ``later``
        gone = log.keys.inbox(log.keys.taskmanager("tm-gone"))
        b.set(gone, b"not a stream")  # an acknowledgement Redis refuses
        again = b.xadd(stream, {b"n": b"3"})
        got = b.xreadgroup(
            "g", "a", {stream: ">"}, count=10, block_ms=None, ack={stream: [first[2], later], gone: ["1-1"]}
        )
        assert [i for _, i, _ in got] == [again] and _pending(b, stream, "g") == 1
        assert b.xreadgroup("g", "a", {}, count=10, block_ms=None, ack={stream: [again]}) == []
        assert _pending(b, stream, "g") == 0

    def test_a_group_created_at_the_end_or_moved_there_sees_only_new_entries(self, log: EventLog) -> None:
        b = log.backend
        stream = log.keys.inbox(log.keys.cluster)
        old = [b.xadd(stream, {b"n": b"old"}) for _ in range(2)]
        b.group_create(stream, "g", "$")
        assert b.group_state(stream, "g") == GroupState(old[-1], 0, None)
        assert b.xreadgroup("g", "a", {stream: ">"}, count=10, block_ms=None) == []
        new = b.xadd(stream, {b"n": b"new"})
        assert [i for _, i, _ in b.xreadgroup("g", "a", {stream: ">"}, count=10, block_ms=None)] == [new]
        b.group_create(stream, "g", "0")  # exists: nothing changes
        assert b.group_state(stream, "g").last_delivered == new
        more = [b.xadd(stream, {b"n": b"more"}) for _ in range(2)]
        b.group_setid(stream, "g", "$")
        assert b.group_state(stream, "g").last_delivered == more[-1]
        assert b.xreadgroup("g", "a", {stream: ">"}, count=10, block_ms=None) == []
        b.group_setid(stream, "g", old[-1])
        assert [i for _, i, _ in b.xreadgroup("g", "b", {stream: ">"}, count=10, block_ms=None)] == [new] + more
        # Delivered again to b: the entry a had pending is b's now.
        assert b.xreadgroup("g", "a", {stream: "0"}, count=10, block_ms=None) == []
        assert b.group_state(stream, "g").pending == 3
        # Creating a group creates an empty stream; "$" on it means "from the start".
        empty = log.keys.inbox(log.keys.job("j1"))
        b.group_create(empty, "g", "$")
        assert b.exists(empty) == 1 and b.xlen(empty) == 0 and b.scan_streams(empty) == [empty]
        assert b.group_state(empty, "g") == GroupState("0-0", 0, None)
        first = b.xadd(empty, {b"n": b"1"})
        assert [i for _, i, _ in b.xreadgroup("g", "a", {empty: ">"}, count=10, block_ms=None)] == [first]

    @pytest.mark.parametrize("how", ["deleted", "clobbered"])
    def test_skipping_to_the_end_survives_the_inbox_made_again_under_it(self, log: EventLog, how: str) -> None:
        """A TaskManager's start (``skip_to_end``) makes its group at its inbox's end, then
        moves it there. When the inbox goes between the two (deleted, or clobbered and set
        aside by a writer) and a writer makes it again, the group is gone: it is made again
        at the end, and nothing written before the start is delivered (issue 28, finding 4:
        NOGROUP escaped the start; on Redis as a raw redis.ResponseError)."""
        inbox = log.keys.inbox(log.keys.taskmanager("tm-1"))
        log.append(inbox, env(heartbeat()))  # to an earlier session: void
        between = env(heartbeat())

        class MadeAgain(Delegating):
            def around(self, name: str, call: Any) -> Any:
                if name == "group_setid" and not log.backend.exists(inbox + ":done"):
                    log.backend.set(inbox + ":done", b"1")
                    if how == "deleted":
                        log.backend.delete(inbox)
                    else:
                        log.backend.delete(inbox)
                        log.backend.set(inbox, b"someone else's")
                        log.set_aside([inbox], "")  # a writer's: the inbox left missing
                    log.append(inbox, between)  # made again by a writer, without the group
                return call()

        consumer = GroupConsumer(EventLog(MadeAgain(log.backend), log.keys), inbox, "taskmanager", "tm-1")
        consumer.skip_to_end()
        assert consumer.read(block_ms=None) == []
        after = env(heartbeat())
        log.append(inbox, after)
        assert [e.envelope for e in consumer.read(block_ms=None)] == [after]

    def test_skipping_to_the_end_survives_the_inbox_clobbered_before_its_pending_entries_are_dropped(
        self, log: EventLog
    ) -> None:
        """What an earlier session read and did not acknowledge is dropped; an inbox
        clobbered just then (the acknowledgement answers WRONGTYPE) is set aside and made
        again, and its pending entries went with it."""
        inbox = log.keys.inbox(log.keys.taskmanager("tm-1"))
        earlier = GroupConsumer(log, inbox, "taskmanager", "tm-1")
        earlier.ensure_group()
        log.append(inbox, env(heartbeat()))
        assert len(earlier.read(block_ms=None)) == 1  # pending, never acknowledged

        class Clobbered(Delegating):
            def around(self, name: str, call: Any) -> Any:
                if name == "xack" and self.inner.exists(inbox) and not self.inner.exists(inbox + ":done"):
                    self.inner.set(inbox + ":done", b"1")
                    self.inner.delete(inbox)
                    self.inner.set(inbox, b"someone else's")
                return call()

        told: list[tuple[str, str, str]] = []
        clobbered = EventLog(Clobbered(log.backend), log.keys)
        clobbered.on_set_aside = lambda *t: told.append(t)
        consumer = GroupConsumer(clobbered, inbox, "taskmanager", "tm-1")
        consumer.skip_to_end()
        assert [t[:2] for t in told] == [(inbox, "string")]
        assert consumer.read(block_ms=None) == [] and pending(log, inbox, "taskmanager") == 0
        after = env(heartbeat())
        log.append(inbox, after)
        assert [e.envelope for e in consumer.read(block_ms=None)] == [after]

    def test_xread_returns_entries_after_each_position(self, log: EventLog) -> None:
        b = log.backend
        s1, s2 = log.keys.facts(log.keys.cluster), log.keys.facts(log.keys.job("j1"))
        a = [b.xadd(s1, {b"n": str(i).encode()}) for i in range(4)]
        c = [b.xadd(s2, {b"n": str(i).encode()}) for i in range(2)]
        missing = log.keys.facts(log.keys.job("nothing"))
        got = b.xread({s1: a[1], missing: "0", s2: "0-0"}, count=10, block_ms=None)
        assert [(s, i) for s, i, _ in got] == [(s1, a[2]), (s1, a[3]), (s2, c[0]), (s2, c[1])]
        assert got[0][2] == {b"n": b"2"}
        got = b.xread({s1: "0", s2: c[0]}, count=1, block_ms=None)  # count is per stream
        assert [(s, i) for s, i, _ in got] == [(s1, a[0]), (s2, c[1])]
        assert b.xread({s1: a[-1], s2: c[-1]}, count=10, block_ms=None) == []

    def test_xrange_pages_after_an_id(self, log: EventLog) -> None:
        b = log.backend
        stream = log.keys.facts(log.keys.cluster)
        ids = [b.xadd(stream, {b"n": str(i).encode()}) for i in range(5)]
        assert [i for i, _ in b.xrange(stream, None, 2)] == ids[:2]
        assert [i for i, _ in b.xrange(stream, "0-0", 10)] == ids
        assert [i for i, _ in b.xrange(stream, ids[1], 2)] == ids[2:4]
        assert b.xrange(stream, ids[4], 2) == [] and b.xrange(log.keys.facts(log.keys.job("x")), None, 5) == []
        ms = ids[0].split("-")[0]
        assert [i for i, _ in b.xrange(stream, str(int(ms) - 1), 10)] == ids  # "<ms>" means "<ms>-0"

    def test_xtrim_minid_drops_older_entries_and_ids_never_go_back(self, log: EventLog) -> None:
        b = log.backend
        stream = log.keys.inbox(log.keys.cluster)
        ids = [b.xadd(stream, {b"n": str(i).encode()}) for i in range(5)]
        assert b.xtrim_minid(stream, ids[2]) == 2
        assert [i for i, _ in b.xrange(stream, None, 10)] == ids[2:]
        assert b.xtrim_minid(stream, ids[2]) == 0
        assert b.xtrim_minid(log.keys.inbox(log.keys.job("x")), ids[2]) == 0
        last = ids[-1].split("-")
        assert b.xtrim_minid(stream, f"{last[0]}-{int(last[1]) + 1}") == 3
        # An empty stream is still a stream, and remembers its last id.
        assert b.exists(stream) == 1 and b.xlen(stream) == 0 and b.last_id(stream) is None
        assert log.streams() == [stream]
        new = b.xadd(stream, {b"n": b"5"})
        assert tuple(map(int, new.split("-"))) > tuple(map(int, ids[-1].split("-")))

    def test_an_entry_deleted_while_pending_comes_back_without_fields(self, log: EventLog) -> None:
        b = log.backend
        stream = log.keys.inbox(log.keys.cluster)
        ids = self._read_all(log, stream, 3)
        assert b.xtrim_minid(stream, ids[2]) == 2
        got = b.xreadgroup("g", "a", {stream: "0"}, count=10, block_ms=None)
        assert got == [(stream, ids[0], None), (stream, ids[1], None), (stream, ids[2], {b"n": b"2"})]
        assert b.group_state(stream, "g").pending == 3  # still pending until acknowledged
        # XAUTOCLAIM (Redis 7) drops them from the group instead of handing them over.
        assert b.xautoclaim(stream, "g", "b", min_idle_ms=0, start="0-0", count=10) == ("0-0", [(ids[2], {b"n": b"2"})])
        assert b.group_state(stream, "g") == GroupState(ids[2], 1, ids[2])
        # A consumer that finds its pending entries deleted acknowledges them, and goes on.
        more = log.append_batch(stream, [env(heartbeat()) for _ in range(2)])
        assert len(b.xreadgroup("g", "c", {stream: ">"}, count=10, block_ms=None)) == 2
        b.xtrim_minid(stream, more[1])
        assert [e.id for e in GroupConsumer(log, stream, "g", "c").pending()] == more[1:]
        assert b.group_state(stream, "g") == GroupState(more[1], 2, ids[2])  # b's (deleted too) and c's

    def test_the_lease_scripts_reply_shapes_ttl_and_epochs(self, log: EventLog) -> None:
        b = log.backend
        k = log.keys
        keys = [k.leader, k.epoch, k.fence(k.cluster)]
        assert b.script("lease_acquire", keys, ["a", 150]) == [1, 1]
        assert b.script("lease_acquire", keys, ["a", 150]) == [1, 0]
        epoch, left = b.script("lease_acquire", keys, ["b", 150])
        assert epoch == 1 and -150 <= left < 0
        fields, ttl = b.hgetall_with_ttl(k.leader)
        assert fields == {b"holder": b"a", b"epoch": b"1"} and 0 < ttl <= 150
        assert b.get(k.epoch) == b"1" and b.get(k.fence(k.cluster)) == b"1"
        time.sleep(0.25)
        assert b.hgetall_with_ttl(k.leader) == ({}, -2)
        assert b.script("lease_renew", [k.leader], ["a", 1, 150, ""]) == 0  # expired
        assert b.script("lease_acquire", keys, ["b", 10_000]) == [2, 1]
        assert b.get(k.epoch) == b"2" and b.get(k.fence(k.cluster)) == b"2"
        assert b.script("lease_renew", [k.leader], ["a", 1, 150, ""]) == 0
        assert b.script("lease_renew", [k.leader], ["b", 1, 150, ""]) == 0  # right holder, wrong epoch
        assert b.script("lease_renew", [k.leader], ["b", 2, 20_000, b.server_id()]) == 1
        assert 10_000 < b.hgetall_with_ttl(k.leader)[1] <= 20_000
        with pytest.raises(ScriptFailed, match="^SLUICE_RESTARTED " + b.server_id()):
            b.script("lease_renew", [k.leader], ["b", 2, 150, "0" * 40])
        assert b.script("lease_release", [k.leader], ["a", 2]) == 0
        assert b.script("lease_release", [k.leader], ["b", 1]) == 0
        assert b.script("lease_release", [k.leader], ["b", 2]) == 1
        assert b.hgetall_with_ttl(k.leader) == ({}, -2)
        assert b.script("lease_acquire", keys, ["a", 150]) == [3, 1]
        # A takeover never lowers a fence that a leader raised further.
        b.script("fence", [k.fence(k.cluster)], [9, ""])
        b.delete(k.leader)
        assert b.script("lease_acquire", keys, ["c", 150]) == [4, 1] and b.get(k.fence(k.cluster)) == b"9"
        b.hset(k.table(k.cluster, "t"), {"x": b"1"})
        assert b.hgetall_with_ttl(k.table(k.cluster, "t")) == ({b"x": b"1"}, -1)

    def test_the_commit_and_fence_scripts_reply_shapes(self, log: EventLog) -> None:
        b = log.backend
        tag = log.keys.cluster
        fence, inbox, facts = log.keys.fence(tag), log.keys.inbox(tag), log.keys.facts(tag)
        reply = b.script("commit", [fence, fence, facts], [3, "", "", 0, 0, "", 3, b"x", "", 3, b"y", "to"])
        # the ids, then (an event had a target) the stream's last id before the commit: none
        assert reply[0] == b"OK" and len(reply) == 4 and all(isinstance(i, bytes) for i in reply)
        assert [i.decode() for i in reply[1:3]] == [i for i, _ in b.xrange(facts, None, 10)] and reply[3] == b""
        assert [f for _, f in b.xrange(facts, None, 10)] == [{b"e": b"x"}, {b"e": b"y", b"to": b"to"}]
        again = b.script("commit", [fence, fence, facts], [3, "", "", 0, 0, "", 3, b"z", "to"])
        assert len(again) == 3 and again[2] == reply[2]
        assert len(b.script("commit", [fence, fence, facts], [3, "", "", 0, 0, "", 3, b"w", ""])) == 2  # no target
        assert b.get(fence) == b"3"
        with pytest.raises(ScriptFailed, match="^SLUICE_STALE 3$"):
            b.script("commit", [fence, fence, facts], [2, "", "", 0, 0, "", 3, b"x", ""])
        assert b.script("fence", [fence], [3, ""]) == 3 and b.script("fence", [fence], [5, b.server_id()]) == 5
        with pytest.raises(ScriptFailed, match="^SLUICE_STALE 5$"):
            b.script("fence", [fence], [4, ""])
        ids = [b.xadd(inbox, {b"n": b"1"}) for _ in range(2)]
        b.group_create(inbox, "jm", "0")
        b.xreadgroup("jm", "c", {inbox: ">"}, count=10, block_ms=None)
        assert b.script("commit", [fence, inbox, facts], [5, "", "jm", 1, ids[0], 0, "", 3, b"z", ""])[0] == b"OK"
        assert b.script("commit", [fence, inbox, facts], [5, "", "jm", 1, ids[0], 0, "", 3, b"z", ""]) == [b"DUP"]
        assert b.script("commit", [fence, inbox, facts], [5, "", "jm", 2, ids[1], ids[0], 0, "", 3, b"z", ""]) == [
            b"DUP"
        ]
        with pytest.raises(ScriptFailed, match="^SLUICE_BAD_COMMIT"):
            b.script("commit", [fence, inbox, facts], [5, "", "jm", 2, ids[1], ids[1], 0, "", 3, b"z", ""])
        with pytest.raises(ScriptFailed, match="^NOGROUP"):
            b.script("commit", [fence, inbox, facts], [5, "", "nogroup", 2, ids[1], ids[0], 0, "", 3, b"z", ""])
        # Redis scripts do not roll back, so every check comes first: a commit that names a
        # key that is not a stream writes nothing, and its inbox entry stays pending.
        table = log.keys.table(tag, "t")
        b.hset(table, {"x": b"1"})
        with pytest.raises(ScriptFailed, match=f"^SLUICE_NOT_A_STREAM {table} is a hash$"):
            b.script("commit", [fence, inbox, facts, table], [7, "", "jm", 1, ids[1], 0, "", 3, b"w", "", 4, b"w", ""])
        assert b.get(fence) == b"5" and b.xlen(facts) == 5
        assert _pending(b, inbox, "jm") == 1
        # A later epoch raises the fence in the commit.
        assert b.script("commit", [fence, inbox, facts], [7, "", "jm", 1, ids[1], 0, "", 3, b"w", ""])[0] == b"OK"
        assert b.get(fence) == b"7" and b.xlen(facts) == 6 and _pending(b, inbox, "jm") == 0

    def test_dead_letter_and_delivery_script_replies(self, log: EventLog) -> None:
        b = log.backend
        tag, target_tag = log.keys.cluster, log.keys.taskmanager("tm-1")
        inbox, dead = log.keys.inbox(tag), log.keys.dead(tag)
        (entry,) = self._read_all(log, inbox, 1)
        parked = b.script("dead_letter", [inbox, dead], ["g", entry, "kind", "why", "n", b"0"])
        assert isinstance(parked, bytes) and b.last_id(dead) == parked.decode()
        assert b.script("dead_letter", [inbox, dead], ["g", entry, "kind", "why", "n", b"0"]) == 0
        ((_, fields),) = b.xrange(dead, None, 10)
        assert fields == {
            b"stream": inbox.encode(),
            b"entry": entry.encode(),
            b"kind": b"kind",
            b"reason": b"why",
            b"field:n": b"0",
        }
        # Parking comes before the acknowledgement: when it fails, the entry stays pending.
        later = b.xadd(inbox, {b"n": b"1"})
        assert [i for _, i, _ in b.xreadgroup("g", "a", {inbox: ">"}, count=10, block_ms=None)] == [later]
        b.set(dead, b"x")  # the dead-letter stream is not a stream: parking fails
        with pytest.raises(ScriptFailed, match="WRONGTYPE"):
            b.script("dead_letter", [inbox, dead], ["g", later, "k", "w"])
        assert _pending(b, inbox, "g") == 1
        b.delete(dead)
        assert isinstance(b.script("dead_letter", [inbox, dead], ["g", later, "k", "w"]), bytes)
        assert _pending(b, inbox, "g") == 0
        target, delivered = log.keys.inbox(target_tag), log.keys.delivered(target_tag)
        assert b.script("deliver", [target, delivered], ["", "o", "1-1", b"a", "1-2", b"b"]) == 2
        assert b.script("deliver", [target, delivered], ["", "o", "1-2", b"b", "2-0", b"c"]) == 1
        assert b.hgetall(delivered) == {b"o": b"2-0"}
        assert [f for _, f in b.xrange(target, None, 10)][-1] == {b"e": b"c", b"from": b"o", b"ref": b"2-0"}
        b.set(log.keys.inbox(log.keys.client("c1")), b"x")
        with pytest.raises(ScriptFailed, match="^SLUICE_NOT_A_STREAM string$"):
            # (a script's keys are of one tag: the client's own delivered hash, as on a cluster)
            b.script(
                "deliver",
                [log.keys.inbox(log.keys.client("c1")), log.keys.delivered(log.keys.client("c1"))],
                ["", "o", "3-0", b"d"],
            )
        with pytest.raises(ScriptFailed, match="^SLUICE_RESTARTED"):
            b.script("deliver", [target, delivered], ["0" * 40, "o", "3-0", b"d"])
        cursor = log.keys.outbox_cursor(tag)
        assert b.script("advance_cursor", [cursor], ["", "5-1"]) == b"5-1"
        assert b.script("advance_cursor", [cursor], ["", "5-0"]) == b"5-1"
        assert b.script("advance_cursor", [cursor], [b.server_id(), "10-0"]) == b"10-0" and b.get(cursor) == b"10-0"

    def test_script_many_answers_each_call_in_order_and_an_error_takes_its_place(self, log: EventLog) -> None:
        b = log.backend
        a, c = log.keys.inbox(log.keys.taskmanager("tm-1")), log.keys.inbox(log.keys.taskmanager("tm-2"))
        delivered_a, delivered_c = (
            log.keys.delivered(log.keys.taskmanager("tm-1")),
            log.keys.delivered(log.keys.taskmanager("tm-2")),
        )
        bad = log.keys.inbox(log.keys.client("c1"))
        b.set(bad, b"x")
        cursor = log.keys.outbox_cursor(log.keys.cluster)
        assert b.script_many([]) == []
        replies = b.script_many(
            [
                ("deliver", [a, delivered_a], ["", "o", "1-1", b"a", "1-2", b"b"]),
                ("deliver", [bad, log.keys.delivered(log.keys.client("c1"))], ["", "o", "1-3", b"x"]),
                ("deliver", [c, delivered_c], ["", "o", "1-4", b"c"]),
                ("deliver", [a, delivered_a], ["", "o", "1-2", b"b", "1-5", b"d"]),  # 1-2 again: dropped
                ("deliver", [c, delivered_c], ["0" * 40, "o", "1-6", b"e"]),  # another server's run id
                ("advance_cursor", [cursor], ["", "1-6"]),
            ]
        )
        assert len(replies) == 6
        assert replies[0] == 2 and replies[2] == 1 and replies[3] == 1 and replies[5] == b"1-6"
        assert isinstance(replies[1], ScriptFailed) and replies[1].text == "SLUICE_NOT_A_STREAM string"
        assert isinstance(replies[4], ScriptFailed) and replies[4].text.startswith("SLUICE_RESTARTED")
        assert [f[b"e"] for _, f in b.xrange(a, None, 10)] == [b"a", b"b", b"d"]
        assert [f[b"e"] for _, f in b.xrange(c, None, 10)] == [b"c"]
        assert b.hgetall(delivered_a) == {b"o": b"1-5"} and b.hgetall(delivered_c) == {b"o": b"1-4"}
        assert b.get(bad) == b"x" and b.get(cursor) == b"1-6"

    def test_the_project_script_moves_rows_and_position_only_from_the_expected_position(self, log: EventLog) -> None:
        b = log.backend
        tag = log.keys.cluster
        pos, table = log.keys.position(tag, "t"), log.keys.table(tag, "t")
        assert b.get_and_hgetall(pos, table) == (None, {})
        assert b.script("project", [pos, table], ["", "", "1-0", 2, "a", b"1", "b", b"2"]) == 1
        assert b.get_and_hgetall(pos, table) == (b"1-0", {b"a": b"1", b"b": b"2"})
        assert b.script("project", [pos, table], ["", "", "2-0", 1, "a", b"9"]) == 0  # moved meanwhile
        assert b.script("project", [pos, table], ["", "0-5", "2-0", 0]) == 0
        assert b.get_and_hgetall(pos, table) == (b"1-0", {b"a": b"1", b"b": b"2"})
        assert b.script("project", [pos, table], ["", "1-0", "2-0", 1, "c", b"3", "a", "nothing"]) == 1
        assert b.get_and_hgetall(pos, table) == (b"2-0", {b"b": b"2", b"c": b"3"})
        assert b.script("project", [pos, table], ["", "2-0", "3-0", 0, "b", "c"]) == 1
        assert b.get_and_hgetall(pos, table) == (b"3-0", {}) and b.exists(table) == 0
        rows = {f"r{i}": {"n": i} for i in range(2500)}  # more than one script call's worth
        assert ReadModels(log).write(tag, "u", expected=None, position="4-0", rows=rows)
        assert ReadModels(log).read(tag, "u") == ("4-0", rows)
        with pytest.raises(StoreRestarted):  # rows read from a server that has restarted since
            ReadModels(log).write(tag, "u", expected="4-0", position="5-0", rows={}, server="0" * 40)
        assert ReadModels(log).read(tag, "u")[0] == "4-0"

    def test_strings_and_hashes(self, log: EventLog) -> None:
        b = log.backend
        tag = log.keys.cluster
        k1, k2, h = tag + ":s1", tag + ":s2", log.keys.table(tag, "h")
        assert b.get(k1) is None and b.exists(k1, k2) == 0
        assert b.set(k1, b"v") and not b.set(k1, b"w", nx=True) and b.get(k1) == b"v"
        assert b.set(k1, b"w") and b.get(k1) == b"w"
        assert b.exists(k1, k1, k2) == 2
        assert b.hset(h, {"a": b"1", "b": b"2"}) == 2 and b.hset(h, {"a": b"3", "c": b"4"}) == 1
        assert b.hget(h, "a") == b"3" and b.hget(h, "zz") is None and b.hget(k2, "a") is None
        assert b.hgetall(h) == {b"a": b"3", b"b": b"2", b"c": b"4"} and sorted(b.hkeys(h)) == [b"a", b"b", b"c"]
        assert b.get_and_hgetall(k1, h) == (b"w", {b"a": b"3", b"b": b"2", b"c": b"4"})
        assert b.delete(k1, k1, k2, h) == 2 and b.exists(k1, h) == 0 and b.hgetall(h) == {} and b.hkeys(h) == []

    def test_scan_streams_matches_redis_globs(self, log: EventLog) -> None:
        b = log.backend
        tag = log.keys.cluster
        names = {n: f"{tag}:{n}" for n in ("a*b", "aXb", "a?b", "a[1]b", "a\\b", "aXXb")}
        for key in names.values():
            b.xadd(key, {b"n": b"1"})
        b.hset(tag + ":aHb", {"not": b"a stream"})
        head = "{" + log.keys.prefix + ":cluster}:"

        def scan(pattern: str) -> set[str]:
            return {k[len(head) :] for k in b.scan_streams(head + pattern)}

        assert scan("a*b") == set(names)
        assert scan("a\\*b") == {"a*b"}
        assert scan("a?b") == {"a*b", "aXb", "a?b", "a\\b"}
        assert scan("a\\?b") == {"a?b"}
        assert scan("a\\[1\\]b") == {"a[1]b"} and scan("a[1]b") == set()
        assert scan("a[X*]b") == {"a*b", "aXb"} and scan("a[^X]b") == {"a*b", "a?b", "a\\b"}
        assert scan("a[A-Z]b") == {"aXb"} and scan("a[Z-A]b") == {"aXb"}
        assert scan("a\\\\b") == {"a\\b"} and scan("a[\\\\]b") == {"a\\b"}
        # Keys.pattern ("{<prefix>:*") finds every stream of this prefix and nothing else.
        b.xadd("{" + log.keys.prefix + "x:cluster}:inbox", {b"n": b"1"})
        try:
            found = set(b.scan_streams(log.keys.pattern))
            assert found == set(names.values())
        finally:
            b.delete("{" + log.keys.prefix + "x:cluster}:inbox")


def _pending(b: Any, stream: str, group: str) -> int:
    state = b.group_state(stream, group)
    assert state is not None
    return state.pending
