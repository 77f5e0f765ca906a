"""A log entry as a person reads it, for ``sluice inspect tail`` and a failing simulation's
trace (tools/sim/trace.py): a stream's short name, an entry as JSON data (``record``) and as
one line of rich markup (``line``), and the streams a person names (``resolve``)."""

from __future__ import annotations

import time

import orjson
from rich.markup import escape

from sluice.errors import DecodeError, SluiceError
from sluice.events import decode_fields
from sluice.store import EventLog

__all__ = ["short", "resolve", "record", "line"]


def short(log: EventLog, stream: str) -> str:
    """``{sluice:cluster}:facts`` -> ``cluster:facts``."""
    head = "{" + log.keys.prefix + ":"
    return stream.replace(head, "", 1).replace("}", "", 1) if stream.startswith(head) else stream


def resolve(log: EventLog, names: tuple[str, ...]) -> list[str]:
    streams = log.streams()
    if not names:
        return streams
    out = []
    for name in names:
        hits = [s for s in streams if s == name or short(log, s) == name]
        if not hits:
            hits = [s for s in streams if short(log, s).endswith(name) or short(log, s).startswith(name + ":")]
        if not hits:
            known = ", ".join(short(log, s) for s in streams) or "none yet"
            raise SluiceError(f"no stream {name!r} under prefix {log.keys.prefix!r}; streams: {known}")
        out += [h for h in hits if h not in out]
    return out


def record(log: EventLog, stream: str, entry_id: str, fields: dict[bytes, bytes]) -> dict:
    """One entry as JSON data: the envelope, a dead letter, or what is wrong with it."""
    base = {"stream": short(log, stream), "entry": entry_id}
    if log.keys.is_dead_letter(stream):
        dead = {k.decode(): v.decode(errors="replace") for k, v in fields.items()}
        return {**base, "dead_letter": dead}
    try:
        env = decode_fields(fields, stream=stream, entry_id=entry_id)
    except DecodeError as exc:
        return {**base, "undecodable": str(exc)}
    rec = {**base, **env.to_dict()}
    if b"to" in fields:
        rec["to"] = short(log, fields[b"to"].decode())
    return rec


def line(rec: dict) -> str:
    ts = rec.get("ts")
    when = time.strftime("%H:%M:%S", time.localtime(ts / 1000)) + f".{ts % 1000:03d}" if ts else "            "
    where = f"[dim]{rec['entry']:>17}[/] [cyan]{escape(rec['stream']):<24}[/]"
    if "dead_letter" in rec:
        d = rec["dead_letter"]
        return f"{where} [red]DEAD[/] {escape(d.get('kind', ''))}: {escape(d.get('reason', ''))} (from {escape(d.get('stream', ''))} {d.get('entry', '')})"
    if "undecodable" in rec:
        return f"{where} [red]UNDECODABLE[/] {escape(rec['undecodable'])}"
    payload = " ".join(f"{k}={_fmt(v)}" for k, v in rec["payload"].items())
    extra = f" [dim]→ {escape(rec['to'])}[/]" if "to" in rec else ""
    epoch = f" e{rec['epoch']}" if rec.get("epoch") else ""
    return f"{where} {when}{epoch} [bold]{rec['type']}[/]{extra} {escape(payload)}"


def _fmt(v: object) -> str:
    text = v if isinstance(v, str) else orjson.dumps(v).decode()
    return text if len(text) <= 60 else text[:57] + "..."
