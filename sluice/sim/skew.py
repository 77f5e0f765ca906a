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
            if d.get("type") == type_name and isinstance(payload, dict) and payload.get(name, value) == value \
                    and type(payload.get(name)) is type(value):
                return _rewrite(raw, type_name, lambda p, n=name: {k: v for k, v in p.items() if k != n}, version)
    return None


def _rewrite(raw: bytes, type_name: str, change: Any, version: int) -> bytes | None:
    if b'"' + type_name.encode() + b'"' not in raw:
        return None
    d = orjson.loads(raw)
    if d.get("type") != type_name or not isinstance(d.get("payload"), dict):
        return None
    return orjson.dumps({**d, "v": version, "payload": change(d["payload"])})
