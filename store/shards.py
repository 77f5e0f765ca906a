"""Shards of a Redis Cluster as Sluice sees them: which shard holds a key, and which server a
writer expects on each.

* A key's **slot** is CRC16 (XMODEM) of its hash tag's content, mod 16384, as Redis Cluster
  computes it (``CLUSTER KEYSLOT``); a cluster created by ``redis-cli --cluster create`` with
  ``n`` masters gives master ``i`` the ``i``-th of ``n`` contiguous slot ranges
  (:func:`slot_ranges`). The in-memory store (store/memory.py) maps tags to shards so.
* A **server identity** names what a writer saw on one shard: ``<run id>:<replication id>``
  (``INFO server`` run_id, ``INFO replication`` master_replid). A restart changes the run id;
  a failover promotes a replica, which has a run id of its own and starts a new replication
  id, so either part changing means the shard may have lost acknowledged writes (replication
  is asynchronous: the same loss as ``appendfsync everysec``, on one shard). A writer on a
  cluster expects the identities of every master, joined with commas (:func:`joined`); a
  script passes when the identity of the node it runs on is among them, and otherwise
  fails with ``SLUICE_RESTARTED`` (store/scripts.py). A single run id (one Redis) is an
  identity too: it is compared with the run id alone.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "SLOTS",
    "identity",
    "joined",
    "keyslot",
    "keeps_every_write",
    "matches",
    "shard_of_slot",
    "sharded",
    "slot_ranges",
]

SLOTS = 16384


def _table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
        table.append(crc & 0xFFFF)
    return table


_CRC = _table()


def _crc16(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ _CRC[((crc >> 8) ^ byte) & 0xFF]
    return crc


def keyslot(key: str | bytes) -> int:
    """The Redis Cluster slot of ``key``: of its hash tag (the part between the first ``{``
    and the next ``}``, when not empty), else of the whole key."""
    data = key.encode() if isinstance(key, str) else key
    start = data.find(b"{")
    if start >= 0:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            data = data[start + 1 : end]
    return _crc16(data) % SLOTS


def slot_ranges(masters: int) -> list[tuple[int, int]]:
    """The slot range (first, last) of each of ``masters`` masters, as ``redis-cli --cluster
    create`` assigns them (3 masters: 0-5460, 5461-10922, 10923-16383)."""
    if masters < 1:
        raise ValueError(f"a cluster has at least one master, not {masters}")
    per = SLOTS / masters
    ranges, first, cursor = [], 0, 0.0
    for i in range(masters):
        last = SLOTS - 1 if i == masters - 1 else int(cursor + per - 1 + 0.5)
        ranges.append((first, last))
        first, cursor = last + 1, cursor + per
    return ranges


def shard_of_slot(slot: int, masters: int) -> int:
    """Which of ``masters`` masters holds ``slot`` (see :func:`slot_ranges`)."""
    for i, (_, last) in enumerate(slot_ranges(masters)):
        if slot <= last:
            return i
    raise ValueError(f"slot {slot} is not in 0-{SLOTS - 1}")


def identity(run_id: str, replid: str) -> str:
    """A server's identity: its run id and its replication id."""
    return f"{run_id}:{replid}"


def joined(identities: Iterable[str]) -> str:
    """The identities a writer expects (one per shard), as one script argument."""
    return ",".join(sorted(identities))


def matches(expected: str, run_id: str, replid: str) -> bool:
    """Whether a node (``run_id``, ``replid``) is one a writer expecting ``expected`` has seen
    (``''``: no check); the same rule as the scripts' ``restarted``."""
    if expected == "":
        return True
    me = identity(run_id, replid)
    return any(seen in (run_id, me) for seen in expected.split(","))


def sharded(server: str) -> bool:
    """Whether ``server`` (what a writer saw: ``server_id``) names the masters of a cluster,
    whose shards fail over one at a time (and not one Redis, whose restart loses a suffix of
    every tag at once): identities, or a cluster backend's ``cluster:<addr>=<run id>,...``."""
    return ":" in server


def keeps_every_write(durable: bool, server: str) -> bool:
    """Whether a change of ``server`` (a restart, a failover) lost no acknowledged write: only
    one Redis with ``appendfsync always`` (``durable``). On a cluster a failover promotes a
    replica that may not have received the last writes, whatever the masters' appendfsync."""
    return durable and not sharded(server)
