"""The envelope every event travels in, and its codec.

One stream entry holds one field, ``e``, whose value is the orjson encoding of::

    {"type": "RegisterTaskManager", "v": 2, "id": "…", "job": null,
     "epoch": 3, "ts": 1700000000000, "cause": "…", "payload": {…}}

``type`` and ``v`` name the event class and the schema version it was written with,
``id`` is unique per event, ``job`` the job it belongs to (``null`` for the cluster),
``epoch`` the writer's leadership epoch (0 for writers that are not leaders), ``ts``
milliseconds since the epoch, ``cause`` the id of the message that caused it.
Decoding is strict: anything else raises a :class:`~sluice.errors.DecodeError` naming
what is wrong (and, given them, the stream and entry).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from sluice.errors import DecodeError, MalformedEnvelope, NotJSON, UnknownEventType

from .schema import EVENT_TYPES, Event, payload_decoder
from .upcast import upcast

__all__ = ["Envelope", "FIELD", "encode", "decode", "decode_fields"]

FIELD = b"e"
"""The stream entry field that holds the encoded envelope."""

_ENVELOPE_KEYS = frozenset(("type", "v", "id", "job", "epoch", "ts", "cause", "payload"))


@dataclass(frozen=True, slots=True)
class Envelope:
    event: Event
    id: str
    epoch: int = 0
    ts: int = 0
    job: str | None = None
    cause: str | None = None

    @property
    def type(self) -> str:
        return self.event.TYPE

    def to_dict(self) -> dict[str, Any]:
        """The envelope as plain JSON data (what ``sluice inspect --json`` prints)."""
        return orjson.loads(encode(self))


def encode(env: Envelope) -> bytes:
    ev = env.event
    return orjson.dumps(
        {
            "type": ev.TYPE,
            "v": ev.VERSION,
            "id": env.id,
            "job": env.job,
            "epoch": env.epoch,
            "ts": env.ts,
            "cause": env.cause,
            "payload": ev,
        }
    )


def decode(raw: bytes | str, *, stream: str | None = None, entry_id: str | None = None) -> Envelope:
    """Decode one encoded envelope; raise a DecodeError naming stream, entry and what is wrong."""
    try:
        return _decode(raw)
    except DecodeError as exc:
        raise exc.at(stream, entry_id) from None


def decode_fields(fields: dict[bytes, bytes] | Any, *, stream: str | None = None, entry_id: str | None = None) -> Envelope:
    """Decode a stream entry given as its field mapping (as redis-py returns it)."""
    raw = fields.get(FIELD) if isinstance(fields, dict) else None
    if raw is None:
        names = sorted(k.decode(errors="replace") if isinstance(k, bytes) else str(k) for k in fields) if isinstance(fields, dict) else []
        raise MalformedEnvelope(
            f"entry has no 'e' field holding an envelope (fields: {', '.join(names) or 'none'}); "
            "write events through Sluice's log, not with a bare XADD"
        ).at(stream, entry_id)
    return decode(raw, stream=stream, entry_id=entry_id)


def _decode(raw: bytes | str) -> Envelope:
    try:
        d = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise NotJSON(f"{exc}; the entry starts with {bytes(raw[:40]) if isinstance(raw, (bytes, bytearray)) else raw[:40]!r}") from None
    if type(d) is not dict:
        raise MalformedEnvelope(f"an envelope is a JSON object, got {type(d).__name__}")
    if len(d) != 8 or not _ENVELOPE_KEYS.issuperset(d):
        missing = sorted(_ENVELOPE_KEYS - set(d))
        extra = sorted(set(d) - _ENVELOPE_KEYS)
        raise MalformedEnvelope(
            f"envelope keys wrong: missing {missing or 'none'}, unexpected {extra or 'none'}; expected {sorted(_ENVELOPE_KEYS)}"
        )
    type_name = d["type"]
    version = d["v"]
    eid = d["id"]
    job = d["job"]
    epoch = d["epoch"]
    ts = d["ts"]
    cause = d["cause"]
    if type(type_name) is not str:
        raise MalformedEnvelope(f"'type' must be a string, got {type(type_name).__name__}")
    if type(version) is not int or type(epoch) is not int or type(ts) is not int:
        raise MalformedEnvelope(
            f"'v', 'epoch' and 'ts' must be integers, got v={version!r}, epoch={epoch!r}, ts={ts!r}"
        )
    if type(eid) is not str or not eid:
        raise MalformedEnvelope(f"'id' must be a non-empty string, got {eid!r}")
    if job is not None and type(job) is not str:
        raise MalformedEnvelope(f"'job' must be a string or null, got {job!r}")
    if cause is not None and type(cause) is not str:
        raise MalformedEnvelope(f"'cause' must be a string or null, got {cause!r}")
    cls = EVENT_TYPES.get(type_name)
    if cls is None:
        raise UnknownEventType(
            f"{type_name!r} is not an event type this Sluice knows ({len(EVENT_TYPES)} known, e.g. "
            f"{', '.join(sorted(EVENT_TYPES)[:4])}, …); was it written by a newer Sluice or by hand?"
        )
    payload = d["payload"]
    if version != cls.VERSION:
        payload = upcast(type_name, version, cls.VERSION, payload)
    try:
        ev = payload_decoder(cls)(payload)
    except DecodeError as exc:
        raise type(exc)(f"{type_name} v{version}: {exc.reason}") from None
    return Envelope(ev, eid, epoch, ts, job, cause)
