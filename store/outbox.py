"""Delivering a tag's outbox into other tags' inboxes: the transactional outbox.

A commit writes cross-tag messages to its own tag's outbox (same commit, same slot).
The committing process then delivers them, in outbox order; recovery delivers again
whatever was left undelivered. The target keeps, per origin outbox, the last entry it
accepted, so a message delivered twice is appended once.
"""

from __future__ import annotations

from collections import defaultdict

from .consumer import ensure_group
from .keys import tag_of
from .log import EventLog, _s, translate_errors
from . import scripts

__all__ = ["Deliverer"]

GROUP = "delivery"


class Deliverer:
    def __init__(self, log: EventLog, origin_tag: str, consumer: str = "deliverer") -> None:
        self.log = log
        self.outbox = log.keys.outbox(origin_tag)
        self.consumer = consumer
        self._deliver = log.client.register_script(scripts.DELIVER)
        self._ready = False

    def _ensure(self) -> None:
        if self._ready:
            return
        ensure_group(self.log, self.outbox, GROUP)
        self._ready = True

    def deliver(self, *, batch: int = 500) -> int:
        """Deliver everything undelivered (earlier leftovers first); returns how many were sent."""
        self._ensure()
        sent = 0
        client = self.log.client
        # Pending ones (read before, not acknowledged: a crash in between), then new ones.
        for start in ("0", ">"):
            while True:
                with translate_errors(f"reading {self.outbox}"):
                    reply = client.xreadgroup(GROUP, self.consumer, {self.outbox: start}, count=batch)
                entries = reply[0][1] if reply else []
                entries = [(i, f) for i, f in entries if f is not None] if start == "0" else entries
                if not entries:
                    break
                sent += self._send(entries)
                if start == "0" and len(entries) < batch:
                    break
        return sent

    def _send(self, entries: list) -> int:
        by_target: dict[str, list[object]] = defaultdict(list)
        ids = []
        for raw_id, fields in entries:
            entry_id = _s(raw_id)
            ids.append(entry_id)
            target = fields.get(b"to")
            if not target:
                continue  # not addressed: nothing to deliver
            by_target[_s(target)] += (entry_id, fields[b"e"])
        n = 0
        client = self.log.client
        with translate_errors(f"delivering from {self.outbox}"):
            for target, args in by_target.items():
                n += int(self._deliver(keys=[target, self.log.keys.delivered(tag_of(target))], args=[self.outbox, *args]))
            client.xack(self.outbox, GROUP, *ids)
        return n
