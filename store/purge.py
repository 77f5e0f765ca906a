"""Removing what a job left in Redis, and the tombstone that stays.

* ``release_transport``: an archived job's transport keys (``Keys.transport``) deleted;
  the marks its outbox left in the tags it delivered to stay (a deliverer that read a page
  before the release hands it over late, and the marks make that a no-op) until a purge
  (``forget_deliveries``);
* ``delete_tag``: every key of a tag (``sluice job purge``);
* ``Tombstones``: one row per purged job in the cluster's tag (``Keys.purged``), so a
  purged job is answered "purged at …" rather than "not found".

Deleting is idempotent: a leader that dies half-way does it again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from .log import EventLog

__all__ = ["Tombstones", "delete_tag", "release_transport", "forget_deliveries"]

_DELETE_BATCH = 500


def delete_tag(log: EventLog, tag: str) -> int:
    """Delete every key of ``tag`` (one hash tag: one slot); how many there were."""
    found = log.backend.scan_keys(log.keys.tag_pattern(tag))
    return sum(log.backend.delete(*found[i : i + _DELETE_BATCH]) for i in range(0, len(found), _DELETE_BATCH))


def forget_deliveries(log: EventLog, origin_tag: str, targets: Iterable[str]) -> int:
    """Drop the marks the outbox of ``origin_tag`` left in the tags ``targets`` (what it had
    delivered there): only once that outbox is gone for good, delivered to its end."""
    outbox = log.keys.outbox(origin_tag)
    return sum(log.backend.hdel(log.keys.delivered(t), outbox) for t in dict.fromkeys(targets))


def release_transport(log: EventLog, tag: str, task_inboxes: Iterable[str] = ()) -> int:
    """Delete the transport keys of a tag whose reader and writer are done with it (an
    archived job: its outbox delivered to its end); how many keys went. The marks its
    outbox left elsewhere stay: a deliverer still holding a page it read before (a deposed
    leader, recovery racing the leader) hands it over late, and only the marks drop it."""
    return log.backend.delete(*log.keys.transport(tag, task_inboxes))


class Tombstones:
    """The rows of purged jobs: job id -> what a person asking about it is told."""

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self.key = log.keys.purged

    def write(self, job_id: str, row: Mapping[str, Any]) -> None:
        self.log.backend.hset(self.key, {job_id: orjson.dumps(dict(row))})

    def read(self, job_id: str) -> dict[str, Any] | None:
        raw = self.log.backend.hget(self.key, job_id)
        return None if raw is None else _row(raw)

    def all(self) -> dict[str, dict[str, Any]]:
        return {k.decode(): _row(v) for k, v in self.log.backend.hgetall(self.key).items()}


def _row(raw: bytes) -> dict[str, Any]:
    try:
        row = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {"note": "an unreadable tombstone"}
    return row if isinstance(row, dict) else {"note": "an unreadable tombstone"}
