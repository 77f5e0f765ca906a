"""The outbox's laws under any interleaving of commits, deliveries (eager or lazy, from the
commit in hand or read back), flushes, commits carrying the cursor's move, and deliverers
that die (losing what they owed) and are started afresh — a hypothesis state machine on
the memory store (the Redis twin's scripts are checked against it in test_memory_store):

* every outbox entry reaches its target at most once, and each target gets them in outbox
  order (its ``ref`` fields ascend);
* the cursor never passes an entry that was not delivered;
* after a last delivery from the cursor, every entry was delivered exactly once.
"""

from __future__ import annotations

import time

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from sluice.store import CommitResult, Deliverer, EventLog, Keys, Out
from sluice.store.log import entry_order
from sluice.store.memory import MemoryBackend, MemoryStore
from tests.helpers import env, heartbeat


class OutboxMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.log = EventLog(MemoryBackend(MemoryStore(clock=lambda: time.time_ns() // 1_000_000), "test"), Keys("laws"))
        keys = self.log.keys
        self.tag = keys.job("j1")
        self.outbox, self.cursor = keys.outbox(self.tag), keys.outbox_cursor(self.tag)
        self.targets = [keys.inbox(keys.taskmanager(f"tm-{i}")) for i in range(2)]
        self.server = self.log.server_id()
        self.deliverers = [Deliverer(self.log, self.tag), Deliverer(self.log, self.tag)]
        self.last: CommitResult | None = None
        self.sent: list[str] = []
        """Every outbox entry id, in order."""

    @rule(to=st.lists(st.integers(0, 1), min_size=1, max_size=3), carrier=st.sampled_from([None, 0, 1]))
    def commit(self, to: list[int], carrier: int | None) -> None:
        d = self.deliverers[carrier] if carrier is not None else None
        advance = d.carry(self.server) if d is not None else None
        outs = [
            Out(self.outbox, env(heartbeat(rid=f"m{len(self.sent) + i}")), to=self.targets[t]) for i, t in enumerate(to)
        ]
        self.last = self.log.commit(self.tag, 1, outs, server=self.server, advance=advance)
        if d is not None and advance is not None:
            d.carried(advance)
        self.sent += [i for i, _, _ in self.last.addressed]

    @rule(who=st.integers(0, 1), lazy=st.booleans(), with_commit=st.booleans(), batch=st.sampled_from([1, 2, 500]))
    def deliver(self, who: int, lazy: bool, with_commit: bool, batch: int) -> None:
        committed = self.last if with_commit else None
        self.deliverers[who].deliver(batch=batch, server=self.server, committed=committed, lazy=lazy)

    @rule(who=st.integers(0, 1))
    def flush(self, who: int) -> None:
        self.deliverers[who].flush()

    @rule(who=st.integers(0, 1))
    def dies(self, who: int) -> None:
        """A deliverer dies: what it owed and where it was are lost; a new one starts."""
        self.deliverers[who] = Deliverer(self.log, self.tag)

    def _delivered(self) -> list[str]:
        refs: list[str] = []
        for target in self.targets:
            mine = [f[b"ref"].decode() for _, f in self.log.backend.xrange(target, None, 10_000)]
            assert mine == sorted(mine, key=entry_order), f"{target} got its entries out of order: {mine}"
            refs += mine
        return refs

    @invariant()
    def at_most_once_in_order_and_never_behind_the_cursor(self) -> None:
        refs = self._delivered()
        assert len(refs) == len(set(refs)), f"delivered twice: {refs}"
        cursor = self.log.backend.get(self.cursor)
        if cursor is not None:
            upto = entry_order(cursor.decode())
            missing = [e for e in self.sent if entry_order(e) <= upto and e not in set(refs)]
            assert not missing, f"the cursor {cursor.decode()} passed entries never delivered: {missing}"

    def teardown(self) -> None:
        Deliverer(self.log, self.tag).deliver(server=self.server)
        refs = self._delivered()
        assert sorted(refs, key=entry_order) == self.sent


TestOutboxLaws = OutboxMachine.TestCase
TestOutboxLaws.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
