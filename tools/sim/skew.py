"""Schema skew: facts of an older and of a newer schema version in one log.

A *newer* Sluice is modelled in this one: it declares ``LeadershipGranted`` at version
``NEWER`` (one above this Sluice's), with a field this one does not know (``zone``), and
writes its grants that way (``as_newer``); it reads that version (``newer_decode``) as
this Sluice's class with the new field left out, which is all its cores use. Everything
else it reads and writes as this Sluice does. A JobManager (or reader) built with
``newer_decode`` is the newer one; one without meets an ``UnsupportedSchemaVersion``.

*Older* facts are this Sluice's facts written at an earlier version where that loses
nothing (``as_older``): an upcast must read them back exactly.
"""

from __future__ import annotations

from typing import Any

import orjson

from sluice.events import Envelope, ExecutionGraphBuilt, JobWaitingForSlots, LeadershipGranted, decode_bytes

__all__ = ["NEWER", "as_newer", "as_older", "newer_decode", "is_newer"]

NEWER = LeadershipGranted.VERSION + 1
"""The schema version of ``LeadershipGranted`` a newer Sluice writes."""
_TYPE = LeadershipGranted.TYPE


def is_newer(raw: bytes) -> bool:
    """Whether ``raw`` is an envelope only a newer Sluice reads."""
    return b'"' + _TYPE.encode() + b'"' in raw and orjson.loads(raw).get("v") == NEWER


def newer_decode(raw: bytes) -> Envelope:
    """Decode as a newer Sluice does (``EventLog(..., decode=newer_decode)``)."""
    if b'"' + _TYPE.encode() + b'"' in raw:
        d = orjson.loads(raw)
        if d.get("type") == _TYPE and d.get("v") == NEWER and isinstance(d.get("payload"), dict):
            payload = {k: v for k, v in d["payload"].items() if k != "zone"}
            raw = orjson.dumps({**d, "v": LeadershipGranted.VERSION, "payload": payload})
    return decode_bytes(raw)


def as_newer(raw: bytes) -> bytes | None:
    """``raw`` as a newer Sluice writes it (None: it writes it as this one does)."""
    return _rewrite(raw, _TYPE, lambda p: {**p, "zone": "z1"}, NEWER)


_OLDER: dict[str, tuple[str, Any, int]] = {
    ExecutionGraphBuilt.TYPE: ("first_attempt", 0, 1),
    JobWaitingForSlots.TYPE: ("until_placed", False, 1),
}
"""type -> (the field a later version added, the value its upcaster gives, the older version)."""


def as_older(raw: bytes) -> bytes | None:
    """``raw`` at an older schema version, when its upcast gives it back exactly (None: not)."""
    for type_name, (name, value, version) in _OLDER.items():
        if b'"' + type_name.encode() + b'"' in raw:
            d = orjson.loads(raw)
            payload = d.get("payload")
            if (
                d.get("type") == type_name
                and isinstance(payload, dict)
                and payload.get(name, value) == value
                and type(payload.get(name)) is type(value)
            ):
                return _rewrite(raw, type_name, lambda p, n=name: {k: v for k, v in p.items() if k != n}, version)
    return None


def _rewrite(raw: bytes, type_name: str, change: Any, version: int) -> bytes | None:
    if b'"' + type_name.encode() + b'"' not in raw:
        return None
    d = orjson.loads(raw)
    if d.get("type") != type_name or not isinstance(d.get("payload"), dict):
        return None
    return orjson.dumps({**d, "v": version, "payload": change(d["payload"])})


# --- in the simulation: the ``schema_skew`` fault ---------------------------------------------

HOLD_BOUND_MS = 10_000
"""The longest an older JobManager may hold the lease, not leading, once a newer fact is in
the log (it replays up to that fact, then must hand the lease over)."""


def skewed_commit(args: list[Any], *, newer: bool, older: bool) -> list[Any]:
    """A commit script's arguments (as ``EventLog.commit`` lays them out) with its facts
    written by a newer Sluice (``newer``: its grants at version ``NEWER``) and, with
    ``older``, the facts that an older version holds exactly at that version."""
    n = int(args[3])
    out = list(args)
    for i in range(6 + n, len(args), 3):
        raw, target = args[i + 1], args[i + 2]
        if target not in ("", b"") or not isinstance(raw, (bytes, str)):
            continue
        data = raw if isinstance(raw, bytes) else raw.encode()
        changed = (as_newer(data) if newer else None) or (as_older(data) if older else None)
        if changed is not None:
            out[i + 1] = changed
    return out


class SkewWatch:
    """No older JobManager holds the lease without leading for longer than ``HOLD_BOUND_MS``
    once a fact only a newer one reads is in the log (it must hand the lease over, not spin)."""

    def __init__(self) -> None:
        self.newer_seen = False
        self.holding: dict[str, int] = {}

    def check(self, sim: Any) -> None:
        from .invariants import Violation

        keys, now = sim.keys, sim.world.now
        if not self.newer_seen:
            self.newer_seen = any(is_newer(f.get(b"e", b"")) for _, f in sim.store.entries(keys.facts(keys.cluster)))
        fields, _ = sim.observer.reader.hgetall_with_ttl(keys.leader)
        holder = fields.get(b"holder", b"").decode()
        for proc in sim.jms[1:]:  # the older ones (jm0 is the newer)
            jm = proc.jm
            if not (self.newer_seen and jm.id == holder and not jm.leading):
                self.holding.pop(jm.id, None)
                continue
            since = self.holding.setdefault(jm.id, now)
            if now - since > HOLD_BOUND_MS:
                raise Violation(
                    f"{jm.id} (an older JobManager) has held the lease for {(now - since) / 1000:.1f} s "
                    f"without leading, while the log holds a fact only a newer one reads (phase "
                    f"{jm.phase}, {len(jm.errors)} errors)"
                )


def skewed_snapshot(data: bytes | str) -> bytes | str:
    """A cluster snapshot as a newer Sluice writes it: its last grant at version ``NEWER``
    (an older JobManager cannot read it, and replays the cluster's facts in full)."""
    raw = data if isinstance(data, bytes) else data.encode()
    if b'"last_grant"' not in raw:
        return data
    d = orjson.loads(raw)
    grant = d.get("last_grant")
    if not isinstance(grant, str):
        return data
    newer = as_newer(grant.encode())
    return data if newer is None else orjson.dumps({**d, "last_grant": newer.decode()})
