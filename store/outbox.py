"""Delivering a tag's outbox into other tags' inboxes: the transactional outbox.

A commit writes cross-tag messages to its own tag's outbox (same commit, same slot). The
committing process then delivers them; recovery delivers again whatever was left
undelivered. Two rules make every entry land exactly once, even when two deliverers (a
deposed leader that resumed, and the new one) work on one outbox at the same time:

* every deliverer starts at the outbox's **cursor** (the last entry delivered, with all
  before it) and hands each target its entries **in outbox order, never skipping one**;
* each target keeps, per origin outbox, the last entry it accepted (its **mark**), and
  drops anything at or before it.

Whoever moves a target's mark to entry *e* has delivered every entry for that target up
to *e*, so an entry the mark drops was delivered before. The cursor only moves forward,
after the entries up to it were handed over. The targets of one page of the outbox get
their entries in one round trip (a pipeline of deliver scripts, one per target); the
cursor moves once every one of them has answered.

An entry that cannot be delivered (its address is not an inbox of this cluster, or names
a key that is not a stream) is parked in the origin tag's dead letters with the reason,
and delivery goes on: one bad address never stops an outbox. An inbox (a key named as
one) that holds another kind of value is moved aside first, kept for a person, and
delivered to (``EventLog.set_aside``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from sluice.errors import ConfigError, StoreRestarted

from . import scripts
from .backend import ScriptCall, ScriptFailed
from .consumer import dead_letter
from .keys import tag_of
from .log import CommitResult, EventLog, entry_order, script_error

__all__ = ["Deliverer", "Undeliverable"]

Undeliverable = Callable[[str, str, str], None]
"""Told (outbox entry id, target, reason) of each entry parked as undeliverable."""


class Deliverer:
    def __init__(self, log: EventLog, origin_tag: str, *, on_undeliverable: Undeliverable | None = None) -> None:
        self.log = log
        self.tag = origin_tag
        self.outbox = log.keys.outbox(origin_tag)
        self.cursor_key = log.keys.outbox_cursor(origin_tag)
        self._on_undeliverable = on_undeliverable
        self._cursor: tuple[str, str] | None = None
        """(server run id, the cursor in force after this deliverer's last advance): where
        its next delivery starts without reading the cursor. Another deliverer may have
        moved the cursor further since; starting before it only hands targets entries their
        marks drop. Kept only for a server that was named (a restarted one refuses the
        scripts) and dropped at any error. When a move is ``owed``, it is the last entry
        this deliverer handed over, ahead of the cursor in Redis."""
        self.owed: tuple[str, str] | None = None
        """(server run id, outbox entry id): handed over, with all before it, but the cursor
        not moved there yet (a lazy delivery): the tag's next commit carries the move
        (``carry``), or ``flush`` makes it. Until then a deliverer starting from the cursor
        hands targets entries their marks drop: it costs work, never a message."""
        self._from_start = False

    def rewind(self) -> None:
        """The next delivery starts at the outbox's first entry, not at its cursor: a target's
        shard failed over (a Redis Cluster) and may have lost entries handed over to it, while
        this outbox's shard kept the cursor past them. The targets' marks, lost with their
        inboxes' entries, drop what they still have; the cursor never moves back."""
        self._from_start = True
        self._cursor = None

    def deliver(
        self, *, batch: int = 500, server: str = "", committed: CommitResult | None = None, lazy: bool = False
    ) -> int:
        """Deliver everything after the cursor; returns how many entries were appended.
        ``server``: the run id the deliverer expects (a restarted server refuses).
        ``committed``: the commit that just wrote to this outbox. When this deliverer's
        cursor is where the outbox ended before it (``committed.before``), the entries after
        the cursor are the commit's own, which it holds: they are handed over without
        reading the outbox back (one round trip less). ``lazy`` (with ``server``): the
        cursor is not moved now but the move owed (``owed``): one more round trip less."""
        try:
            if self._from_start:
                sent = self._deliver(batch, server, lazy, from_start=True)
                self._from_start = False
                return sent
            if committed is not None and self._holds_the_rest(committed, server):
                return self._deliver_committed(committed, server, lazy)
            return self._deliver(batch, server, lazy)
        except BaseException:
            self._cursor = None
            raise

    def carry(self, server: str) -> str | None:
        """The cursor move owed, for a commit to the tag on ``server`` to carry (None: none)."""
        owed = self.owed
        return owed[1] if owed is not None and owed[0] == server else None

    def carried(self, entry_id: str) -> None:
        """A commit moved the cursor to ``entry_id`` (or found it further already)."""
        if self.owed is not None and self.owed[1] == entry_id:
            self.owed = None

    def forget_owed_unless(self, server: str) -> None:
        """Drop a move owed on a server other than ``server`` (one that restarted since)."""
        if self.owed is not None and self.owed[0] != server:
            self.owed = None

    def flush(self) -> None:
        """Move the cursor as owed, if it is. A restarted server refuses (StoreRestarted), and
        the move is dropped: what it stood for may be lost with the server's writes."""
        owed = self.owed
        if owed is None:
            return
        try:
            self._advance(owed[1], owed[0])
        except StoreRestarted:
            self._cursor = self.owed = None
            raise
        except BaseException:  # (Redis away: the move stays owed)
            self._cursor = None
            raise

    def _handed_over(self, after: str, server: str, lazy: bool) -> None:
        """Entries up to ``after`` were handed over: move the cursor, or owe the move."""
        if lazy and server:
            self.owed = self._cursor = (server, after)
        else:
            self._advance(after, server)

    def _holds_the_rest(self, committed: CommitResult, server: str) -> bool:
        return (
            bool(server)
            and bool(committed.addressed)
            and committed.outbox == self.outbox
            and self._cursor == (server, committed.before)
        )

    def _deliver_committed(self, committed: CommitResult, server: str, lazy: bool) -> int:
        by_target: dict[str, list[object]] = {}
        for entry_id, target, data in committed.addressed:
            by_target.setdefault(target, []).extend((entry_id, data))
        sent = self._deliver_page(by_target, server)
        self._handed_over(committed.addressed[-1][0], server, lazy)
        return sent

    def _advance(self, after: str, server: str) -> None:
        """Move the cursor to ``after`` (entries up to it were handed over)."""
        try:
            in_force = self.log.backend.script("advance_cursor", [self.cursor_key], [server, after])
        except ScriptFailed as exc:
            raise script_error(exc, self.tag) from exc
        if self.owed is not None and (self.owed[0] != server or entry_order(self.owed[1]) <= entry_order(after)):
            self.owed = None  # moved at least as far (or owed on a server that is gone)
        if server:
            self._cursor = (server, in_force.decode() if isinstance(in_force, bytes) else str(in_force))

    def _deliver(self, batch: int, server: str, lazy: bool, *, from_start: bool = False) -> int:
        """``from_start``: start at the outbox's first entry (``rewind``), not at the cursor."""
        backend = self.log.backend
        after: str | None = None
        if from_start:
            pass
        elif server and self._cursor is not None and self._cursor[0] == server:
            after = self._cursor[1]
        else:
            cursor = backend.get(self.cursor_key)
            after = cursor.decode() if cursor else None
        sent = 0
        while True:
            entries = backend.xrange(self.outbox, after, batch)
            if not entries:
                return sent
            by_target: dict[str, list[object]] = {}
            for entry_id, fields in entries:
                target = fields.get(b"to")
                if not target:
                    continue  # not addressed: nothing to deliver
                by_target.setdefault(target.decode(errors="replace"), []).extend((entry_id, fields.get(b"e", b"")))
            sent += self._deliver_page(by_target, server)
            after = entries[-1][0]
            self._handed_over(after, server, lazy)
            if len(entries) < batch:
                return sent

    def _deliver_page(self, by_target: dict[str, list[object]], server: str) -> int:
        """Hand each target its entries of one page (every target's deliver script in one
        round trip); park those of a target that cannot take them. Returns how many were
        appended. A script error other than a target that is not a stream raises before
        anything is parked (the cursor stays: the next delivery repeats the page)."""
        keys = self.log.keys
        plan: list[tuple[str, list[object], str | int]] = []
        """(target, its (entry id, data) pairs flat, why it is undeliverable or its call's index)."""
        calls: list[ScriptCall] = []
        for to, pairs in by_target.items():
            problem = keys.inbox_problem(to)
            if problem is None:
                try:
                    delivered = keys.delivered(tag_of(to))
                except ConfigError as exc:
                    problem = str(exc)
                else:
                    plan.append((to, pairs, len(calls)))
                    calls.append(("deliver", [to, delivered], [server, self.outbox, *pairs]))
                    continue
            plan.append((to, pairs, problem))
        replies = self._run(calls)
        again = [i for i, r in enumerate(replies) if isinstance(r, ScriptFailed) and keys.is_inbox(calls[i][1][0])]
        if again:
            # An inbox that holds another kind of value (something else wrote its key): moved
            # aside, kept for a person, and the delivery goes again (its reader makes its group
            # at its next read). Parking would lose the message for its reader: a job whose
            # SubmitJob was parked never began.
            self.log.set_aside([calls[i][1][0] for i in again])
            for i, reply in zip(again, self._run([calls[i] for i in again])):
                replies[i] = reply
        sent = 0
        for to, pairs, outcome in plan:
            if isinstance(outcome, int):
                reply = replies[outcome]
                if not isinstance(reply, ScriptFailed):
                    sent += int(reply)
                    continue
                outcome = f"{to!r} holds a {reply.text.rsplit(' ', 1)[-1]}, not a stream"
            self._park(to, pairs, outcome)
        return sent

    def _run(self, calls: list[ScriptCall]) -> list[Any]:
        """The deliver scripts' replies; a failure other than a target that is not a stream
        raises (before anything is parked)."""
        replies = self.log.backend.script_many(calls) if calls else []
        for reply in replies:
            if isinstance(reply, ScriptFailed) and scripts.NOT_A_STREAM not in reply.text:
                raise script_error(reply, self.tag) from reply
        return replies

    def _park(self, target: str, pairs: list[object], problem: str) -> None:
        reason = f"undeliverable: {problem}; the message stays here with its address"
        for i in range(0, len(pairs), 2):
            entry_id, data = str(pairs[i]), cast(bytes, pairs[i + 1])  # (entry id, its field e) pairs, flat
            dead_letter(
                self.log, self.outbox, "", entry_id, {b"e": data, b"to": target.encode()}, "undeliverable", reason
            )
            if self._on_undeliverable is not None:
                self._on_undeliverable(entry_id, target, reason)
