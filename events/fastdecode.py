"""The replay path's decoder: the same envelopes as ``decode_bytes``, decoded by msgspec.

``decode_bytes`` (orjson, then checks and the payload decoder in Python) is the reference:
what it accepts and refuses, and the error it raises, is the codec's contract. This module
decodes the envelope and the payload in C, and is exact by construction:

- it accepts only what its strict msgspec types accept: the envelope's eight keys and
  nothing else, each of its type (integers within the signed 64-bit range), a known event type at a version it can read without Python, and a payload
  whose every key is a declared field (a strict mirror ``Struct`` with
  ``forbid_unknown_fields``) of the declared type;
- anything else, and every event class whose fields are not plain (a nested record, a JSON
  value, a float), is decoded by ``decode_bytes``, which accepts it (then its result is the
  answer) or raises the error it always raised.

An older version is read in C when its upcasters only add constants (``{**p, "x": c}``:
probed once) that are the current class's defaults for those fields: its mirror declares
the fields of that version, and the current class is filled with the defaults.
tests/events/test_fastdecode.py holds the law: for any input, both decoders give the same
envelope or the same error.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Annotated, Any

import msgspec

from .envelope import Envelope, decode_bytes
from .schema import EVENT_TYPES, Event
from .upcast import _STEPS

__all__ = ["decode_bytes_msgspec"]

# orjson reads an integer outside [-2**63, 2**64) as a float (then refused where an int is
# due); msgspec bounds only fit int64, so one above it goes to ``decode_bytes``.
_Int = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]


class _Envelope(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    type: str
    v: _Int
    id: str
    job: str | None
    epoch: _Int
    ts: _Int
    cause: str | None
    payload: msgspec.Raw


_ENVELOPE = msgspec.json.Decoder(_Envelope)
_SCALAR = {str: str, bool: bool, int: _Int, type(None): type(None)}


def _mirror_type(tp: Any) -> Any:
    """The strict msgspec type of a field, or None when it is not one msgspec checks exactly
    as the payload decoder does (then the class is left to ``decode_bytes``)."""
    if tp in _SCALAR:
        return _SCALAR[tp]
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp if all(type(m.value) is str for m in tp) and issubclass(tp, str) else None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        inner = [a for a in args if a is not type(None)]
        if len(args) == 2 and len(inner) == 1:
            m = _mirror_type(inner[0])
            return None if m is None else m | None
        return None
    if origin is list:
        (item,) = typing.get_args(tp)
        return list.__class_getitem__(_SCALAR[item]) if item in (str, bool, int) else None
    if origin is dict:
        key, val = typing.get_args(tp)
        return dict.__class_getitem__((str, _SCALAR[val])) if key is str and val in (str, bool, int) else None
    return None


_IMMUTABLE = (str, int, bool, type(None))


def _added(type_name: str, version: int, current: int) -> dict[str, Any] | None:
    """The constants the upcasters from ``version`` to ``current`` add, when each step only
    adds constants (probed: a step's result on {} and on {probe: x}); else None."""
    added: dict[str, Any] = {}
    probe = object()
    for v in range(version, current):
        step = _STEPS.get((type_name, v))
        if step is None:
            return None
        try:
            base = step({})
            probed = step({"\0probe": probe})
        except Exception:
            return None
        if type(base) is not dict or probed != {**base, "\0probe": probe} or probed["\0probe"] is not probe:
            return None
        if not all(type(x) in _IMMUTABLE for x in base.values()):
            return None
        added.update(base)
    return added


def _decoders(cls: type[Event]) -> dict[int, tuple[Any, Any]] | None:
    """Per version readable in C, (strict mirror decoder, class decoder); None when none is."""
    hints = typing.get_type_hints(cls)
    fields = list(dataclasses.fields(cls))  # type: ignore[arg-type]
    if not all(f.init for f in fields):
        return None  # (msgspec fills a field the payload decoder never reads)
    mirrored = []
    for f in fields:
        m = _mirror_type(hints[f.name])
        if m is None or f.default_factory is not dataclasses.MISSING:
            return None
        mirrored.append((f, m))
    try:
        whole = msgspec.json.Decoder(cls)
    except (TypeError, msgspec.MsgspecError):
        return None
    out: dict[int, tuple[Any, Any]] = {}
    for version in range(1, cls.VERSION + 1):
        added = _added(cls.TYPE, version, cls.VERSION) if version < cls.VERSION else {}
        if added is None:
            continue
        by_name = {f.name: f for f in fields}
        if any(
            k not in by_name
            or by_name[k].default is dataclasses.MISSING
            or by_name[k].default != v
            or type(by_name[k].default) is not type(v)
            for k, v in added.items()
        ):
            continue
        spec = [
            (f.name, m) if f.default is dataclasses.MISSING else (f.name, m, f.default)
            for f, m in mirrored
            if f.name not in added
        ]
        mirror = msgspec.defstruct(
            f"{cls.__name__}V{version}",
            spec,
            forbid_unknown_fields=True,
            gc=False,
        )
        out[version] = (msgspec.json.Decoder(mirror), whole)
    return out or None


_BY_TYPE: dict[str, dict[int, tuple[Any, Any]] | None] = {}
_new_envelope = tuple.__new__
_Error = (msgspec.MsgspecError, ValueError, TypeError)


def _compile() -> None:
    for name, cls in EVENT_TYPES.items():
        _BY_TYPE[name] = _decoders(cls)


def decode_bytes_msgspec(raw: bytes | str) -> Envelope:
    """Decode one encoded envelope as ``decode_bytes`` does (the same envelope or the same
    error), faster: msgspec where its strict types say exactly what ``decode_bytes`` would."""
    if len(_BY_TYPE) != len(EVENT_TYPES):
        _compile()
    try:
        e = _ENVELOPE.decode(raw)
        by_version = _BY_TYPE.get(e.type)
        if by_version is None or not e.id:
            return decode_bytes(raw)
        decoders = by_version.get(e.v)
        if decoders is None:
            return decode_bytes(raw)
        mirror, whole = decoders
        payload = e.payload
        mirror.decode(payload)  # refuses an undeclared field (the class decoder ignores one)
        ev = whole.decode(payload)
    except _Error:
        return decode_bytes(raw)  # it accepts (its answer) or raises the error it always raised
    return _new_envelope(Envelope, (ev, e.id, e.epoch, e.ts, e.job, e.cause))
