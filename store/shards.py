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
* A **sharded server id** (what ``server_id`` returns on a cluster, or on the in-memory
  store's shards) names each master with the slot ranges it serves:
  ``<name>@<first>-<last>[+<first>-<last>...]=<identity>``, joined with commas (a cluster's
  is prefixed ``c<7 hex digits>:``, store/cluster_backend.py). Two of them tell which slot
  ranges failed over in between (:func:`failed_slots`): those now served by a master whose
  identity the earlier id did not name. Only the tags in them lost writes; recovery is per
  shard (services/jobmanager/restarts.py).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "SLOTS",
    "Slots",
    "failed_slots",
    "identity",
    "in_slots",
    "master_part",
    "masters_of",
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
    (``''``: no check); the same rule as the scripts' ``restarted`` (a sharded server id's
    parts are compared by their identity, after the ``=``)."""
    if expected == "":
        return True
    me = identity(run_id, replid)
    return any(seen.rpartition("=")[2] in (run_id, me) for seen in expected.split(","))


Slots = list[tuple[int, int]]
"""Slot ranges, (first, last) each, inclusive."""


def master_part(name: str, ranges: Slots, ident: str) -> str:
    """One master of a sharded server id: its name (an address), the slots it serves, its identity."""
    return f"{name}@{'+'.join(f'{a}-{b}' for a, b in ranges)}={ident}"


def masters_of(server: str) -> list[tuple[str, Slots, str]] | None:
    """The masters a sharded server id names: (name, slot ranges, identity) each; None when
    ``server`` names no slot ranges (one Redis's run id, or an id from before they were named)."""
    body = server[9:] if server[:1] == "c" and server[8:9] == ":" else server
    out: list[tuple[str, Slots, str]] = []
    for part in body.split(","):
        head, eq, ident = part.partition("=")
        name, at, spans = head.rpartition("@")
        if not eq or not at:
            return None
        try:
            ranges = [(int(a), int(b)) for a, _, b in (span.partition("-") for span in spans.split("+"))]
        except ValueError:
            return None
        out.append((name, ranges, ident))
    return out or None


def failed_slots(before: str, now: str) -> Slots | None:
    """The slot ranges that failed over (or restarted) between two sharded server ids: those
    served now by a master whose identity ``before`` does not name (a promoted replica has a
    run id and a replication id of its own; a master that only took over slots from another,
    as a resharding does, kept its writes). None: either id names no slot ranges (one Redis:
    everything may have lost writes)."""
    old, new = masters_of(before), masters_of(now)
    if old is None or new is None:
        return None
    seen = {ident for _, _, ident in old}
    return sorted(r for _, ranges, ident in new if ident not in seen for r in ranges)


def in_slots(slot: int, ranges: Slots | None) -> bool:
    """Whether ``slot`` is in ``ranges`` (None: every slot)."""
    return ranges is None or any(a <= slot <= b for a, b in ranges)


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
