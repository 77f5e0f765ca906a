"""What any backend of the log must do. Backends subclass ``LogContract`` and provide
the ``log`` fixture (see test_log_redis.py, test_log_docker.py)."""

from __future__ import annotations

import threading
import time

import pytest

from sluice.errors import ScriptError, StaleEpoch, StoreError, StoreRestarted
from sluice.store.backend import Delegating
from sluice.events import FIELD, TaskManagerRegistered, decode
from sluice.store import Consumed, Deliverer, EventLog, GroupConsumer, LeaderLease, Out, ReadModels
from tests.helpers import env, heartbeat, register


def pending(log: EventLog, inbox: str, group: str = "jm") -> int:
    state = log.backend.group_state(inbox, group)
    return state.pending if state else 0


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
        (_, fields), = list(log.replay_raw(outbox))
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
            assert not log.commit(tag, 1, [Out(facts, env(registered(e.envelope.event.resource_id)))],
                                  Consumed(inbox, "jm", e.id)).duplicate
        # The dead consumer comes back and tries to commit what it had read: a no-op.
        late = log.commit(tag, 1, [Out(facts, env(registered("x")))], Consumed(inbox, "jm", taken[0].id))
        assert late.duplicate
        assert log.length(facts) == 4

    @pytest.mark.parametrize(
        "fields, kind, says",
        [
            ({b"e": b"{not json"}, "not JSON", "unexpected character"),
            ({b"x": b"1"}, "malformed envelope", "no 'e' field"),
            ({b"e": b'{"type":"Bogus","v":1,"id":"i","job":null,"epoch":0,"ts":0,"cause":null,"payload":{}}'},
             "unknown event type", "'Bogus'"),
            ({b"e": b'{"type":"TaskManagerHeartbeat","v":1,"id":"i","job":null,"epoch":0,"ts":0,"cause":null,'
                    b'"payload":{"resource_id":"a","session":"s","epoch":1}}'}, "missing field", "'slots_free'"),
            ({b"e": b'{"type":"TaskManagerHeartbeat","v":1,"id":"i","job":null,"epoch":0,"ts":0,"cause":null,'
                    b'"payload":{"resource_id":"a","session":"s","epoch":"1","slots_free":0}}'}, "wrong field type", "'epoch'"),
            ({b"e": b'{"type":"TaskManagerHeartbeat","v":9,"id":"i","job":null,"epoch":0,"ts":0,"cause":null,'
                    b'"payload":{}}'}, "unsupported schema version", "newer Sluice"),
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
        log.backend.script("deliver", [target, log.keys.delivered(target_tag)],
                           ["", log.keys.outbox(tag), first_id, first_fields[FIELD]])
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
            log.commit(tag, 1, [Out(log.keys.outbox(tag), e, to=target) for e in sent[i:i + 100]])
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

    @pytest.mark.parametrize("bad", ["no-tag-at-all", "{x:client:c1}:inbox", "HASH"])
    def test_an_undeliverable_entry_is_parked_and_the_rest_of_the_outbox_is_delivered(self, log: EventLog,
                                                                                       bad: str) -> None:
        """Bug 3: a reply address with no hash tag, of another cluster, or naming a key that
        is not a stream used to raise in every delivery, forever."""
        tag = log.keys.cluster
        good = log.keys.inbox(log.keys.taskmanager("tm-1"))
        if bad == "HASH":
            bad = log.keys.inbox(log.keys.client("c1"))
            log.backend.hset(bad, {"x": b"1"})
        parked: list = []
        a, b, c = (env(heartbeat(), epoch=1) for _ in range(3))
        log.commit(tag, 1, [Out(log.keys.outbox(tag), a, to=good), Out(log.keys.outbox(tag), b, to=bad),
                            Out(log.keys.outbox(tag), c, to=good)])
        d = Deliverer(log, tag, on_undeliverable=lambda *x: parked.append(x))
        assert d.deliver() == 2
        assert [e for _, e in log.replay(good)] == [a, c]
        ((_, dead),) = list(log.replay_raw(log.keys.dead(tag)))
        assert dead[b"kind"] == b"undeliverable" and bad.encode() in dead[b"field:to"]
        assert decode(dead[b"field:e"]) == b
        assert len(parked) == 1 and d.deliver() == 0

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


