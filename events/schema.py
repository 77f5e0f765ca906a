"""Declaring events: the ``@event`` decorator, the type registry and strict payload decoders.

An event class is a frozen, slotted dataclass declared once with its protocol name and
schema version::

    @event("RegisterTaskManager", version=2)
    class RegisterTaskManager(Event):
        resource_id: str
        slots: int

Declaring it registers it by name and compiles a strict decoder for its payload: every
field present (or defaulted), of the declared type, and nothing else. Supported field
types are the JSON ones: ``str``, ``int``, ``float`` (ints accepted), ``bool``, ``None``
unions, ``list[T]``, ``dict[str, T]``, ``str`` enums, nested ``@record`` dataclasses, and
``JSON`` for opaque values (a coordinator's state, an operator event's body).
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from sluice.errors import MissingField, UnexpectedField, WrongFieldType

__all__ = ["event", "record", "Event", "JSON", "EVENT_TYPES", "event_class", "payload_decoder"]

T = TypeVar("T")

_Converter = Callable[[Any], Any]
"""A decoded field's check: the value back (converted where it must be), or WrongFieldType."""

JSON = typing.NewType("JSON", object)
"""A field holding any JSON value, passed through as decoded."""


class Event:
    """Base of every event class. ``TYPE`` is the protocol name, ``VERSION`` the schema version."""

    __slots__ = ()
    TYPE: ClassVar[str]
    VERSION: ClassVar[int]


EVENT_TYPES: dict[str, type[Event]] = {}
_DECODERS: dict[type, _Converter] = {}


def event_class(type_name: str) -> type[Event] | None:
    return EVENT_TYPES.get(type_name)


def payload_decoder(cls: type) -> _Converter:
    """The compiled strict decoder of a ``@record`` or ``@event`` class."""
    dec = _DECODERS.get(cls)
    if dec is None:
        dec = _DECODERS[cls] = _compile(cls)
    return dec


@typing.dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,))
def record(cls: type[T]) -> type[T]:
    """A frozen, slotted dataclass usable as a nested field of events."""
    return dataclasses.dataclass(frozen=True, slots=True)(cls)


@typing.dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,))
def event(type_name: str, *, version: int = 1) -> Callable[[type[T]], type[T]]:
    """Declare an event class under its protocol name with its current schema version."""

    def wrap(cls: type[T]) -> type[T]:
        if not issubclass(cls, Event):
            raise TypeError(f"{cls.__name__} must subclass Event")
        if type_name in EVENT_TYPES:
            raise TypeError(f"event type {type_name!r} is declared twice")
        cls.TYPE = type_name
        cls.VERSION = version
        dc = dataclasses.dataclass(frozen=True, slots=True)(cls)
        EVENT_TYPES[type_name] = dc
        return dc

    return wrap


# --- compiling decoders -------------------------------------------------------------------


def _fail_type(path: str, expected: str, value: Any) -> typing.NoReturn:
    raise WrongFieldType(f"field {path!r} must be {expected}, got {type(value).__name__} {_short(value)}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _converter(tp: Any, path: str) -> tuple[_Converter | None, str]:
    """A function checking (and converting) one JSON value, or None when a type check is enough.

    Returns (converter, simple_type_test) where the test is a Python expression on ``v``
    used inline by the compiled decoder for the common scalar cases.
    """
    origin = typing.get_origin(tp)
    if tp is str:
        return None, "type(v) is str"
    if tp is bool:
        return None, "type(v) is bool"
    if tp is int:
        return None, "type(v) is int"
    if tp is float:
        return (lambda v: float(v) if type(v) is int else v), "type(v) is float or type(v) is int"
    if tp is JSON or tp is Any:
        return None, "True"
    if tp is type(None):
        return None, "v is None"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        values = {m.value: m for m in tp}

        def conv_enum(v: Any, _values: dict[Any, enum.Enum] = values, _tp: type = tp) -> Any:
            try:
                return _values[v]
            except (KeyError, TypeError):
                _fail_type(path, f"one of {sorted(map(str, _values))}", v)

        return conv_enum, ""
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 1 and len(args) == 2:
            inner, test = _converter(non_none[0], path)
            if inner is None:
                return None, f"v is None or ({test})"

            def conv_opt(v: Any, _inner: _Converter = inner) -> Any:
                return None if v is None else _inner(v)

            return conv_opt, ""
        raise TypeError(f"unsupported union {tp} at {path}")
    if origin is list:
        (item,) = typing.get_args(tp)
        conv, test = _converter(item, path + "[]")
        if item in _SCALARS:
            return _scalar_container(list, "a list", _SCALARS[item], path, _describe(item)), ""
        check = _as_function(conv, test, item, path + "[]")

        def conv_list(v: Any, _check: _Converter = check) -> Any:
            if type(v) is not list:
                _fail_type(path, "a list", v)
            return [_check(x) for x in v]

        return conv_list, ""
    if origin is dict:
        key, val = typing.get_args(tp)
        if key is not str:
            raise TypeError(f"dict keys must be str at {path}")
        conv, test = _converter(val, path + "{}")
        if val in _SCALARS:
            return _scalar_container(dict, "an object", _SCALARS[val], path, _describe(val)), ""
        check = _as_function(conv, test, val, path + "{}")

        def conv_dict(v: Any, _check: _Converter = check) -> Any:
            if type(v) is not dict:
                _fail_type(path, "an object", v)
            return {k: _check(x) for k, x in v.items()}

        return conv_dict, ""
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        dec = payload_decoder(tp)

        def conv_record(v: Any, _dec: _Converter = dec) -> Any:
            try:
                return _dec(v)
            except (MissingField, WrongFieldType, UnexpectedField) as exc:
                raise type(exc)(f"in {path!r}: {exc.reason}") from None

        return conv_record, ""
    raise TypeError(f"unsupported field type {tp!r} at {path}")


_SCALARS = {str: frozenset({str}), int: frozenset({int}), bool: frozenset({bool})}


def _scalar_container(
    kind: type[list[Any]] | type[dict[str, Any]], kind_name: str, allowed: frozenset[type], path: str, item: str
) -> _Converter:
    """A list or dict of one scalar type, checked at C speed (no per-item Python call)."""

    def check(v: Any) -> Any:
        if type(v) is not kind:
            _fail_type(path, kind_name, v)
        types_seen = set(map(type, v.values() if isinstance(v, dict) else v))
        if not types_seen <= allowed:
            bad = next(x for x in (v.values() if isinstance(v, dict) else v) if type(x) not in allowed)
            _fail_type(path + ("{}" if kind is dict else "[]"), item, bad)
        return v

    return check


def _as_function(conv: _Converter | None, test: str, tp: Any, path: str) -> _Converter:
    if conv is not None:
        return conv
    if test == "True":
        return lambda v: v
    expected = _describe(tp)
    ns: dict[str, Any] = {"_fail": _fail_type}
    exec(f"def check(v):\n    if not ({test}):\n        _fail({path!r}, {expected!r}, v)\n    return v\n", ns)
    check: _Converter = ns["check"]
    return check


def _describe(tp: Any) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", type(None): "null"}
    if tp in names:
        return names[tp]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    return str(tp)


def _compile(cls: type) -> _Converter:
    """Generate a decoder for ``cls``: a fast straight-line path for the usual payload (every
    declared field present, nothing else) and a careful path for everything else (defaults,
    and the precise error for a missing, unexpected or mistyped field)."""
    hints = typing.get_type_hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.init]
    name = getattr(cls, "TYPE", cls.__name__)
    ns: dict[str, Any] = {
        "_cls": cls,
        "_new": object.__new__,
        "_fail": _fail_type,
        "_Missing": MissingField,
        "_Unexpected": UnexpectedField,
        "_Wrong": WrongFieldType,
        "_names": frozenset(f.name for f in fields),
    }
    checks: list[tuple[int, dataclasses.Field[Any], _Converter | None, str]] = []
    for i, f in enumerate(fields):
        conv, test = _converter(hints[f.name], f.name)
        checks.append((i, f, conv, test))
        if conv is not None:
            ns[f"_c{i}"] = conv

    def check_lines(i: int, f: dataclasses.Field[Any], conv: _Converter | None, test: str, indent: str) -> list[str]:
        tp = hints[f.name]
        if isinstance(tp, type) and issubclass(tp, enum.Enum):  # inline: the member by value, else the error
            ns[f"_e{i}"] = {m.value: m for m in tp}
            return [
                f"{indent}try:",
                f"{indent}    a{i} = _e{i}[a{i}]",
                f"{indent}except (KeyError, TypeError):",
                f"{indent}    _c{i}(a{i})",
            ]
        if conv is not None:
            return [f"{indent}a{i} = _c{i}(a{i})"]
        if test != "True":
            return [
                f"{indent}if not ({_subst(test, f'a{i}')}):",
                f"{indent}    _fail({f.name!r}, {_describe(hints[f.name])!r}, a{i})",
            ]
        return []

    # The careful path.
    slow = [
        "def slow(p):",
        f"    if len(p) > {len(fields)} or not _names.issuperset(p):",
        f"        raise _Unexpected('payload of {name} has fields it does not declare: ' + ', '.join(sorted(set(p) - _names)) + '; declared: ' + ', '.join(sorted(_names)))",
    ]
    for i, f, conv, test in checks:
        slow.append(f"    a{i} = p.get({f.name!r}, _Missing)")
        slow.append(f"    if a{i} is _Missing:")
        if f.default is not dataclasses.MISSING:
            ns[f"_d{i}"] = f.default
            slow.append(f"        a{i} = _d{i}")
        elif f.default_factory is not dataclasses.MISSING:
            ns[f"_df{i}"] = f.default_factory
            slow.append(f"        a{i} = _df{i}()")
        else:
            msg = f"{name} needs field {f.name!r} ({_describe(hints[f.name])})"
            slow.append(f"        raise _Missing({msg!r})")
        slow.append("    else:")
        slow += check_lines(i, f, conv, test, "        ") or ["        pass"]
    slow.append(f"    return _cls({', '.join(f'{f.name}=a{i}' for i, f, _, _ in checks)})")

    # The fast path: no defaults to fill, no key to report, the slots set directly
    # (a frozen dataclass's __init__ goes through object.__setattr__ per field).
    fast_construct = not hasattr(cls, "__post_init__") and hasattr(cls, "__slots__")
    fast = [
        "def decode(p):",
        "    if type(p) is not dict:",
        f"        raise _Wrong('payload of {name} must be an object, got ' + type(p).__name__)",
        f"    if len(p) != {len(fields)}:",
        "        return slow(p)",
        "    try:",
    ]
    fast += [f"        a{i} = p[{f.name!r}]" for i, f, _, _ in checks] or ["        pass"]
    fast += ["    except KeyError:", "        return slow(p)"]
    for i, f, conv, test in checks:
        fast += check_lines(i, f, conv, test, "    ")
    if fast_construct:
        fast.append("    o = _new(_cls)")
        for i, f, _, _ in checks:
            ns[f"_set{i}"] = cls.__dict__[f.name].__set__
            fast.append(f"    _set{i}(o, a{i})")
        fast.append("    return o")
    else:
        fast.append(f"    return _cls({', '.join(f'{f.name}=a{i}' for i, f, _, _ in checks)})")
    exec("\n".join(slow), ns)
    exec("\n".join(fast), ns)
    decode: _Converter = ns["decode"]
    return decode


def _subst(test: str, var: str) -> str:
    """Rename the checked variable ``v`` in a generated type test."""
    import re

    return re.sub(r"\bv\b", var, test)
