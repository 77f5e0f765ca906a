"""A job's log as a file: ``sluice job export`` writes it, ``sluice job import`` loads it
under a fresh prefix, where every inspect command, ``sluice replay``, the projector and the
dashboard work as they did on the original.

The file is JSON lines::

    {"sluice_export": 1, "job_id": "j1", "prefix": "sluice", "exported_at": <ms>,
     "counts": {"entries": 120, "blobs": 1, "streams": {"{job:j1}:facts": 80, ...}}}
    {"stream": "{cluster}:facts", "id": "1763870000000-0", "fields": {"e": "{...}"}}
    ...
    {"blob": "<sha256>", "data": "<base64>"}

One line per entry, streams in name order, entries in id order: the job's streams (its
facts, inboxes, outbox, dead letters, its subtasks' inboxes), then the cluster facts that
concern it (those naming the job, every TaskManager's registration, report on the storage
root, loss and leaving, every
grant of leadership, every restart of the log); then the job's code blob. Stream names are
relative to the prefix (``{job:j1}:facts`` is ``{<prefix>:job:j1}:facts``). Fields are raw:
a value that is not UTF-8 is ``{"b64": "..."}``, and an entry with a field name that is not
UTF-8 has ``fields`` as a list of [name, value] pairs in the same encoding.

Exporting the import of an export gives back the same lines but for the header's.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from sluice.errors import ConfigError, NotAnExport, PrefixInUse, SluiceError
from sluice.events import (
    JobSubmitted,
    LeadershipGranted,
    LogRestarted,
    TaskManagerLost,
    TaskManagerRegistered,
    TaskManagerStorageReach,
    TaskManagerUnregistered,
    decode_fields,
)
from sluice.store import Blobs, EventLog, Keys, entry_order, tag_of
from sluice.store.archive import append_with_ids, keys_under

__all__ = [
    "EXPORT_VERSION",
    "Export",
    "NotAnExport",
    "PrefixInUse",
    "collect",
    "export_lines",
    "parse",
    "load",
    "free_prefix",
    "ensure_free",
    "relative",
    "absolute",
]

EXPORT_VERSION = 1

_CLUSTER_WIDE = (
    TaskManagerRegistered,
    TaskManagerStorageReach,
    TaskManagerLost,
    TaskManagerUnregistered,
    LeadershipGranted,
    LogRestarted,
)
"""Cluster facts an export keeps whatever job they name (see the module's docstring)."""
_ENTRY_ID = re.compile(r"^\d+-\d+$")


Fields = dict[bytes, bytes]


@dataclass
class Export:
    job_id: str
    prefix: str
    entries: list[tuple[str, str, Fields]] = field(default_factory=list)
    """(stream relative to the prefix, entry id, raw fields), streams in name order."""
    blobs: list[tuple[str, bytes]] = field(default_factory=list)
    missing_blobs: list[str] = field(default_factory=list)
    """Code blobs the job's facts name that the store does not hold (exported without them)."""

    def counts(self) -> dict[str, Any]:
        streams: dict[str, int] = {}
        for stream, _, _ in self.entries:
            streams[stream] = streams.get(stream, 0) + 1
        return {"entries": len(self.entries), "blobs": len(self.blobs), "streams": streams}


# --- names -------------------------------------------------------------------------------


def relative(keys: Keys, stream: str) -> str:
    """``{<prefix>:job:j1}:facts`` -> ``{job:j1}:facts``."""
    head = "{" + keys.prefix + ":"
    if not stream.startswith(head):
        raise ConfigError(f"{stream!r} is not a stream under prefix {keys.prefix!r}")
    return "{" + stream[len(head) :]


def absolute(keys: Keys, rel: str) -> str:
    """``{job:j1}:facts`` -> ``{<prefix>:job:j1}:facts``."""
    return "{" + keys.prefix + ":" + rel[1:]


# --- export ------------------------------------------------------------------------------


def collect(log: EventLog, job_id: str) -> Export:
    """Everything an export of ``job_id`` holds, read from the log now."""
    keys = log.keys
    tag = keys.job(job_id)
    if log.last_id(keys.facts(tag)) is None:
        raise SluiceError(f"job {job_id!r} not found under prefix {keys.prefix!r}: `sluice list` shows the jobs")
    out = Export(job_id, keys.prefix)
    streams = sorted(
        [s for s in log.streams() if tag_of(s) == tag] + [keys.facts(keys.cluster)], key=lambda s: relative(keys, s)
    )
    digests: list[str] = []
    for stream in streams:
        rel = relative(keys, stream)
        is_facts = stream == keys.facts(tag)
        for entry_id, fields in log.replay_raw(stream):
            if stream == keys.facts(keys.cluster):
                if not _concerns(fields, stream, entry_id, job_id):
                    continue
            elif is_facts:
                env = decode_fields(fields, stream=stream, entry_id=entry_id)
                if isinstance(env.event, JobSubmitted) and env.event.code_blob not in digests:
                    digests.append(env.event.code_blob)
            out.entries.append((rel, entry_id, dict(fields)))
    blobs = Blobs(log)
    for digest in digests:
        data = blobs.get(digest)
        if data is None:
            out.missing_blobs.append(digest)
        else:
            out.blobs.append((digest, data))
    return out


def _concerns(fields: Fields, stream: str, entry_id: str, job_id: str) -> bool:
    env = decode_fields(fields, stream=stream, entry_id=entry_id)
    return env.job == job_id or getattr(env.event, "job_id", None) == job_id or isinstance(env.event, _CLUSTER_WIDE)


def export_lines(export: Export, *, exported_at: int) -> Iterator[str]:
    """The file's lines (without newlines): the header, one per entry, one per blob."""
    yield orjson.dumps(
        {
            "sluice_export": EXPORT_VERSION,
            "job_id": export.job_id,
            "prefix": export.prefix,
            "exported_at": exported_at,
            "counts": export.counts(),
        }
    ).decode()
    for stream, entry_id, fields in export.entries:
        yield orjson.dumps({"stream": stream, "id": entry_id, "fields": _encode_fields(fields)}).decode()
    for digest, data in export.blobs:
        yield orjson.dumps({"blob": digest, "data": base64.b64encode(data).decode()}).decode()


def _text(raw: bytes) -> str | dict[str, str]:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return {"b64": base64.b64encode(raw).decode()}


def _encode_fields(fields: Fields) -> dict[str, Any] | list[list[Any]]:
    try:
        return {name.decode(): _text(value) for name, value in fields.items()}
    except UnicodeDecodeError:
        return [[_text(name), _text(value)] for name, value in fields.items()]


# --- import ------------------------------------------------------------------------------


def parse(lines: Iterable[str | bytes], source: str) -> Export:
    """An export read back, every line checked before anything is written; NotAnExport
    naming ``source`` and the line for anything an export does not hold."""
    it = iter(enumerate(lines, start=1))
    first = next(it, None)
    if first is None:
        raise NotAnExport(f"{source} is empty: not a Sluice export (`sluice job export JOB FILE` writes one)")
    header = _json(first[1], source, 1)
    if not isinstance(header, dict) or "sluice_export" not in header:
        raise NotAnExport(
            f"{source} line 1: not a Sluice export (its first line is not a header "
            '{"sluice_export": 1, "job_id": ...}; `sluice job export JOB FILE` writes one)'
        )
    version = header["sluice_export"]
    if version != EXPORT_VERSION:
        raise NotAnExport(
            f"{source}: export version {version!r} is not one this Sluice reads (it reads "
            f"{EXPORT_VERSION}); import it with the Sluice that exported it, or export it again"
        )
    job_id, prefix, counts = header.get("job_id"), header.get("prefix"), header.get("counts")
    try:
        Keys().job(job_id if isinstance(job_id, str) else "")
    except ConfigError as exc:
        raise NotAnExport(f"{source} line 1: the header's job_id is not usable: {exc}") from None
    if not isinstance(prefix, str) or not isinstance(counts, dict):
        raise NotAnExport(f"{source} line 1: the header lacks its prefix or counts")
    assert isinstance(job_id, str)
    out = Export(job_id, prefix)
    last: dict[str, str] = {}
    for number, raw in it:
        if not (raw.strip() if isinstance(raw, str) else raw.strip()):
            continue
        line = _json(raw, source, number)
        where = f"{source} line {number}"
        if isinstance(line, dict) and set(line) == {"stream", "id", "fields"}:
            stream, entry_id = _stream(line["stream"], job_id, where), line["id"]
            if not isinstance(entry_id, str) or not _ENTRY_ID.match(entry_id) or entry_id == "0-0":
                raise NotAnExport(f"{where}: {entry_id!r} is not a stream entry id (like 1763870000000-0)")
            if stream in last and entry_order(entry_id) <= entry_order(last[stream]):
                raise NotAnExport(
                    f"{where}: entry {entry_id} of {stream} comes after {last[stream]}: "
                    "entries must be in id order within a stream"
                )
            last[stream] = entry_id
            out.entries.append((stream, entry_id, _decode_fields(line["fields"], where)))
        elif isinstance(line, dict) and set(line) == {"blob", "data"}:
            out.blobs.append(_blob(line["blob"], line["data"], where))
        else:
            raise NotAnExport(f'{where}: neither an entry {{"stream", "id", "fields"}} nor a blob {{"blob", "data"}}')
    if out.counts() != counts:
        raise NotAnExport(
            f"{source}: the header counts {orjson.dumps(counts).decode()} but the file holds "
            f"{orjson.dumps(out.counts()).decode()}: the file is cut short or was edited"
        )
    return out


def _json(raw: str | bytes, source: str, number: int) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        what = "not a Sluice export" if number == 1 else "not JSON"
        raise NotAnExport(f"{source} line {number}: {what} ({exc})") from None


def _stream(rel: Any, job_id: str, where: str) -> str:
    ok = (
        isinstance(rel, str)
        and (rel == "{cluster}:facts" or rel.startswith("{job:" + job_id + "}:"))
        and Keys().is_stream_name(absolute(Keys(), rel))
    )
    if not ok:
        raise NotAnExport(
            f"{where}: stream {rel!r} is neither one of job {job_id!r}'s streams "
            f"({{job:{job_id}}}:facts, ...) nor {{cluster}}:facts"
        )
    assert isinstance(rel, str)
    return rel


def _bytes(value: Any, where: str) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, dict) and set(value) == {"b64"} and isinstance(value["b64"], str):
        try:
            return base64.b64decode(value["b64"], validate=True)
        except binascii.Error:
            pass
    raise NotAnExport(
        f'{where}: a field is {orjson.dumps(value).decode()[:60]}, neither a string nor {{"b64": "<base64>"}}'
    )


def _decode_fields(fields: Any, where: str) -> Fields:
    if isinstance(fields, dict):
        pairs = [(name.encode(), _bytes(value, where)) for name, value in fields.items()]
    elif isinstance(fields, list) and all(isinstance(p, list) and len(p) == 2 for p in fields):
        pairs = [(_bytes(name, where), _bytes(value, where)) for name, value in fields]
    else:
        raise NotAnExport(f"{where}: fields must be an object (or a list of [name, value] pairs)")
    if not pairs:
        raise NotAnExport(f"{where}: an entry has at least one field")
    return dict(pairs)


def _blob(digest: Any, data: Any, where: str) -> tuple[str, bytes]:
    raw = _bytes({"b64": data}, where)
    if hashlib.sha256(raw).hexdigest() != digest:
        raise NotAnExport(
            f"{where}: the blob's data does not hash to its name {str(digest)[:70]!r}: the file was damaged or edited"
        )
    assert isinstance(digest, str)
    return digest, raw


def ensure_free(log: EventLog, *, how: str) -> None:
    """PrefixInUse unless the log's prefix holds no key; ``how`` says how to pick another."""
    found = keys_under(log, limit=3)
    if found:
        raise PrefixInUse(
            f"prefix {log.keys.prefix!r} is not empty: it holds {', '.join(found)}"
            f"{' and more' if len(found) == 3 else ''}; {how}"
        )


def free_prefix(log: EventLog, job_id: str, make: Callable[[str], EventLog]) -> EventLog:
    """The log of the first free prefix ``import-<job>-<n>`` (n = 1, 2, ...), ``make``
    building a log for a prefix."""
    stem = re.sub(r"[^A-Za-z0-9_.\-]", "-", f"import-{job_id}")[:56]
    for n in range(1, 10_000):
        candidate = make(f"{stem}-{n}")
        if not keys_under(candidate, limit=1):
            return candidate
    raise ConfigError(f"prefixes {stem}-1 to {stem}-9999 are all taken: pass --prefix")


def load(log: EventLog, export: Export) -> dict[str, int]:
    """Write ``export`` under the log's prefix (which must hold no key), entry ids kept;
    entries written per stream."""
    ensure_free(log, how="import into a fresh prefix: pass another --prefix, or none for a generated one")
    by_stream: dict[str, list[tuple[str, Mapping[bytes, bytes]]]] = {}
    for stream, entry_id, fields in export.entries:
        by_stream.setdefault(stream, []).append((entry_id, fields))
    written = {rel: append_with_ids(log, absolute(log.keys, rel), entries) for rel, entries in by_stream.items()}
    blobs = Blobs(log)
    for _, data in export.blobs:
        blobs.put(data)
    return written
