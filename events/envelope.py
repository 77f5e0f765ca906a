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

from collections.abc import Callable
from typing import Any, NamedTuple

import orjson

from sluice.errors import DecodeError, MalformedEnvelope, NotJSON, UnknownEventType

from .schema import EVENT_TYPES, Event, payload_decoder
from .upcast import upcast

__all__ = ["Envelope", "FIELD", "encode", "decode", "decode_bytes", "decode_fields"]

FIELD = b"e"
"""The stream entry field that holds the encoded envelope."""

_ENVELOPE_KEYS = frozenset(("type", "v", "id", "job", "epoch", "ts", "cause", "payload"))


class Envelope(NamedTuple):
    """An event with its metadata. Immutable; a tuple underneath because replay builds
    millions of them and a tuple is the cheapest immutable record Python has."""

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
        data: dict[str, Any] = orjson.loads(encode(self))
        return data


def encode(env: Envelope) -> bytes:
    """``env`` as bytes. An event that holds nothing its previous version lacks may be
    written as that version (its class's ``written_as``): a reader of the previous release
    reads it, which a rolling upgrade needs when a process upgraded before its readers writes
    it (a TaskManager, before the leader: README, rolling upgrades)."""
    ev = env.event
    version: int = ev.VERSION
    payload: Any = ev
    older = getattr(ev, "written_as", None)
    if older is not None and (down := older()) is not None:
        version, payload = down
    return orjson.dumps(
        {
            "type": ev.TYPE,
            "v": version,
            "id": env.id,
            "job": env.job,
            "epoch": env.epoch,
            "ts": env.ts,
            "cause": env.cause,
            "payload": payload,
        }
    )


def decode(
    raw: bytes | str,
    *,
    stream: str | None = None,
    entry_id: str | None = None,
    codec: Callable[[Any], Envelope] | None = None,
) -> Envelope:
    """Decode one encoded envelope; raise a DecodeError naming stream, entry and what is wrong.
    ``codec``: the decoder of another schema (``EventLog.decode``; default ``decode_bytes``)."""
    try:
        return (codec or decode_bytes)(raw)
    except DecodeError as exc:
        raise exc.at(stream, entry_id) from None


def decode_fields(
    fields: dict[bytes, bytes] | Any,
    *,
    stream: str | None = None,
    entry_id: str | None = None,
    codec: Callable[[Any], Envelope] | None = None,
) -> Envelope:
    """Decode a stream entry given as its field mapping (as redis-py returns it)."""
    raw = fields.get(FIELD) if isinstance(fields, dict) else None
    if raw is None:
        names = (
            sorted(k.decode(errors="replace") if isinstance(k, bytes) else str(k) for k in fields)
            if isinstance(fields, dict)
            else []
        )
        raise MalformedEnvelope(
            f"entry has no 'e' field holding an envelope (fields: {', '.join(names) or 'none'}); "
            "write events through Sluice's log, not with a bare XADD"
        ).at(stream, entry_id)
    return decode(raw, stream=stream, entry_id=entry_id, codec=codec)


def decode_bytes(raw: bytes | str) -> Envelope:
    """Decode one encoded envelope; errors do not name a stream (the caller adds it with
    ``DecodeError.at``). The hot path of replay."""
    try:
        d = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        start = bytes(raw[:40]) if isinstance(raw, (bytes, bytearray, memoryview)) else raw[:40]
        raise NotJSON(f"{exc}; the entry starts with {start!r}") from None
    if type(d) is not dict or len(d) != 8:
        raise _envelope_error(d)
    try:
        type_name = d["type"]
        version = d["v"]
        eid = d["id"]
        job = d["job"]
        epoch = d["epoch"]
        ts = d["ts"]
        cause = d["cause"]
        payload = d["payload"]
    except KeyError:
        raise _envelope_error(d) from None
    if not (
        type(version) is int
        and type(epoch) is int
        and type(ts) is int
        and type(eid) is str
        and eid
        and (job is None or type(job) is str)
        and (cause is None or type(cause) is str)
    ):
        raise _field_error(version, epoch, ts, eid, job, cause)
    spec = _SPECS.get(type_name) if type(type_name) is str else None
    if spec is None:
        spec = _spec(type_name)
    cls, current, decoder = spec
    if version != current:
        payload = upcast(type_name, version, current, payload)
    try:
        ev = decoder(payload)
    except DecodeError as exc:
        raise type(exc)(f"{type_name} v{version}: {exc.reason}") from None
    return _new_envelope(Envelope, (ev, eid, epoch, ts, job, cause))  # Envelope(...) without its Python __new__


_new_envelope = tuple.__new__


_SPECS: dict[str, tuple[type[Event], int, Any]] = {}


def _spec(type_name: Any) -> tuple[type[Event], int, Any]:
    if type(type_name) is not str:
        raise MalformedEnvelope(f"'type' must be a string, got {type(type_name).__name__}")
    cls = EVENT_TYPES.get(type_name)
    if cls is None:
        raise UnknownEventType(
            f"{type_name!r} is not an event type this Sluice knows ({len(EVENT_TYPES)} known, e.g. "
            f"{', '.join(sorted(EVENT_TYPES)[:4])}, …); was it written by a newer Sluice or by hand?"
        )
    spec = _SPECS[type_name] = (cls, cls.VERSION, payload_decoder(cls))
    return spec


def _envelope_error(d: Any) -> MalformedEnvelope:
    if type(d) is not dict:
        return MalformedEnvelope(f"an envelope is a JSON object, got {type(d).__name__}")
    missing = sorted(_ENVELOPE_KEYS - set(d))
    extra = sorted(set(d) - _ENVELOPE_KEYS)
    return MalformedEnvelope(
        f"envelope keys wrong: missing {missing or 'none'}, unexpected {extra or 'none'}; expected {sorted(_ENVELOPE_KEYS)}"
    )


def _field_error(version: Any, epoch: Any, ts: Any, eid: Any, job: Any, cause: Any) -> MalformedEnvelope:
    if type(version) is not int or type(epoch) is not int or type(ts) is not int:
        return MalformedEnvelope(
            f"'v', 'epoch' and 'ts' must be integers, got v={version!r}, epoch={epoch!r}, ts={ts!r}"
        )
    if type(eid) is not str or not eid:
        return MalformedEnvelope(f"'id' must be a non-empty string, got {eid!r}")
    if job is not None and type(job) is not str:
        return MalformedEnvelope(f"'job' must be a string or null, got {job!r}")
    return MalformedEnvelope(f"'cause' must be a string or null, got {cause!r}")
