"""Dead letters: the entries parked because they could not be decoded or handled, with why
(``sluice inspect dead-letters``), and re-driving one back onto the inbox it came from.

A dead letter (JSON)::

    {"id": its entry id in the dead-letter stream, "dead_stream": that stream,
     "at": ms (when it was parked), "stream": the stream it was parked from,
     "entry": its entry id there, "kind": the error kind, "reason": why, for a person,
     "type": the event type (None when the entry does not decode), "job_id",
     "to": the address of an undeliverable outbox entry (else None),
     "redrivable": whether it can go back (it came from an inbox), "data": the entry's own
     envelope as text (cut to 2,000 characters)}

Re-driving appends the entry's own fields, as they were, to the inbox it came from and
removes the dead letter, in one transaction; its consumer reads it as a new message (fix
the cause first: an entry that still cannot be handled is parked again). An entry parked
by outbox delivery (an address that is not an inbox of this cluster) cannot go back.
"""

from __future__ import annotations

import re

import orjson

from sluice.errors import UnknownDeadLetter
from sluice.store import EventLog, entry_order
from sluice.store.inspection import DEAD_FIELD_PREFIX, entry, redrive_entry

__all__ = ["dead_letters", "redrive", "UnknownDeadLetter"]

_ENTRY = re.compile(r"^\d+-\d+$")
_DATA_SHOWN = 2000


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode(errors="replace")


def _letter(log: EventLog, dead: str, entry_id: str, fields: dict[bytes, bytes]) -> dict:
    own = {k[len(DEAD_FIELD_PREFIX) :]: v for k, v in fields.items() if k.startswith(DEAD_FIELD_PREFIX)}
    data = own.get(b"e")
    kind = job = None
    if data is not None:
        try:
            env = orjson.loads(data)
            if isinstance(env, dict):
                kind = env.get("type") if isinstance(env.get("type"), str) else None
                job = env.get("job") if isinstance(env.get("job"), str) else None
        except orjson.JSONDecodeError:
            pass
    origin = _text(fields.get(b"stream")) or ""
    text = _text(data)
    return {
        "id": entry_id,
        "dead_stream": dead,
        "at": entry_order(entry_id)[0],
        "stream": origin,
        "entry": _text(fields.get(b"entry")),
        "kind": _text(fields.get(b"kind")),
        "reason": _text(fields.get(b"reason")),
        "type": kind,
        "job_id": job,
        "to": _text(own.get(b"to")),
        "redrivable": log.keys.is_inbox(origin),
        "data": text if text is None or len(text) <= _DATA_SHOWN else text[: _DATA_SHOWN - 3] + "...",
    }


def _dead_streams(log: EventLog) -> list[str]:
    return [s for s in log.streams() if log.keys.is_dead_letter(s)]


def dead_letters(log: EventLog) -> list[dict]:
    """Every parked entry of every tag, oldest first."""
    out = []
    for dead in _dead_streams(log):
        out += [_letter(log, dead, i, f) for i, f in log.replay_raw(dead)]
    return sorted(out, key=lambda d: (entry_order(d["id"]), d["dead_stream"]))


def redrive(log: EventLog, entry_id: str, dead_stream: str | None = None) -> dict:
    """Put dead letter ``entry_id`` back on the inbox it came from; the dead letter as it
    was, with ``redriven_as``: its new entry id in that inbox. ``dead_stream`` picks the
    dead-letter stream when two hold an entry of that id. UnknownDeadLetter when there is
    no such dead letter, or it cannot be re-driven."""
    listing = "`sluice inspect dead-letters` lists them"
    if not _ENTRY.match(entry_id):
        raise UnknownDeadLetter(f"{entry_id!r} is not a dead letter's id (ids look like 1763870000000-0): {listing}")
    found = []
    for dead in _dead_streams(log) if dead_stream is None else [dead_stream]:
        fields = entry(log, dead, entry_id)
        if fields is not None:
            found.append(_letter(log, dead, entry_id, fields))
    if not found:
        raise UnknownDeadLetter(f"no dead letter {entry_id} under prefix {log.keys.prefix!r}: {listing}")
    if len(found) > 1:
        raise UnknownDeadLetter(
            f"dead letter id {entry_id} is in several dead-letter streams "
            f"({', '.join(d['dead_stream'] for d in found)}): name the one to re-drive"
        )
    (letter,) = found
    if not letter["redrivable"]:
        raise UnknownDeadLetter(
            f"dead letter {entry_id} came from {letter['stream'] or 'an unknown stream'}, not an inbox"
            + (
                f" (an outbox entry for {letter['to']!r}, which is not an inbox of this cluster)"
                if letter["to"]
                else ""
            )
            + ": only an inbox entry can be re-driven"
        )
    fields = entry(log, letter["dead_stream"], entry_id) or {}
    own = {k[len(DEAD_FIELD_PREFIX) :]: v for k, v in fields.items() if k.startswith(DEAD_FIELD_PREFIX)}
    new_id = redrive_entry(log, letter["dead_stream"], entry_id, letter["stream"], own)
    if new_id is None:
        raise UnknownDeadLetter(f"dead letter {entry_id} was re-driven or removed meanwhile: {listing}")
    return {**letter, "redriven_as": new_id}
