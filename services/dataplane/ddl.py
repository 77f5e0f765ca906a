"""A schema written as a Spark DDL string (``"a INT, b STRING"``), checked in pure Python.

A source's schema travels in the job graph as text (the graph is JSON), and is checked when
the job is submitted, where no Spark session is at hand: ``problems`` follows the grammar of
Spark's ``parseTableSchema`` (columns ``name type [NOT NULL] [COMMENT 'text']``; types
``array<T>``, ``map<K, V>``, ``struct<name: T, ...>``, ``decimal(p, s)``, ``varchar(n)``,
``interval day to second``, ...) and knows Spark's type names, so a typo (``"a INTEGR"``), a
missing type or an unbalanced ``<`` is refused before anything runs. Spark itself parses the
string when a task reads (``DataFrameReader.schema``), so the two cannot disagree on meaning:
this check only refuses early what Spark would refuse late.

``to_ddl`` writes a PySpark ``StructType`` as such a string (what ``read_csv(schema=...)``
does with one, on the client).
"""

from __future__ import annotations

import re
from typing import Any

from sluice.errors import DataplaneError as _Bad  # (raised inside the parser, caught by problems)

__all__ = ["problems", "to_ddl", "column_names"]

_SIMPLE = {
    "boolean",
    "tinyint",
    "byte",
    "smallint",
    "short",
    "int",
    "integer",
    "bigint",
    "long",
    "float",
    "real",
    "double",
    "date",
    "timestamp",
    "timestamp_ltz",
    "timestamp_ntz",
    "string",
    "binary",
    "void",
    "variant",
}
_PARAMETERS = {
    "decimal": (0, 2),
    "dec": (0, 2),
    "numeric": (0, 2),
    "char": (1, 1),
    "character": (1, 1),
    "varchar": (1, 1),
}
_INTERVAL_UNITS = {"year", "month", "day", "hour", "minute", "second"}
_TOKEN = re.compile(r"\s*(?:(`(?:[^`]|``)*`)|('(?:[^'\\]|\\.)*')|([A-Za-z0-9_]+)|([<>(),:])|(\S))")


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens: list[tuple[str, str]] = []  # (kind, text): word, quoted, string, punct
        for m in _TOKEN.finditer(text):
            quoted, string, word, punct, other = m.groups()
            if other is not None:
                raise _Bad(f"unexpected character {other!r}")
            if quoted is not None:
                self.tokens.append(("quoted", quoted[1:-1].replace("``", "`")))
            elif string is not None:
                self.tokens.append(("string", string))
            elif word is not None:
                self.tokens.append(("word", word))
            elif punct is not None:
                self.tokens.append(("punct", punct))
        self.i = 0
        self.names: list[str] = []
        self.types: list[str] = []
        """Every type name met, nested ones included (lower case)."""
        self.tops: list[str] = []
        """The type name of each top-level column."""

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        tok = self.peek()
        if tok is None:
            raise _Bad("it ends too early")
        self.i += 1
        return tok

    def at(self, text: str) -> bool:
        tok = self.peek()
        return tok is not None and tok[0] in ("word", "punct") and tok[1].lower() == text

    def expect(self, text: str) -> None:
        tok = self.peek()
        if not self.at(text):
            raise _Bad(f"expected {text!r}, found {tok[1]!r}" if tok else f"expected {text!r} at the end")
        self.i += 1

    def name(self) -> str:
        kind, text = self.take()
        if kind not in ("word", "quoted") or (kind == "quoted" and not text):
            raise _Bad(f"expected a column name, found {text!r}")
        return text

    def columns(self, end: str | None) -> list[str]:
        """``name type [NOT NULL] [COMMENT '...']``, separated by commas, until ``end`` (or the end)."""
        names: list[str] = []
        if end is not None and self.at(end):
            return names
        while True:
            names.append(self.name())
            if end is not None and self.at(":"):
                self.take()
            if end is None:
                tok = self.peek()
                self.tops.append(tok[1].lower() if tok else "")
            self.type()
            while self.at("not") or self.at("comment") or self.at("collate"):
                word = self.take()[1].lower()
                if word == "not":
                    self.expect("null")
                elif word == "comment":
                    if self.take()[0] != "string":
                        raise _Bad("COMMENT needs a quoted string ('like this')")
                else:
                    self.name()
            if not self.at(","):
                return names
            self.take()

    def type(self) -> None:
        kind, word = self.take()
        if kind != "word":
            raise _Bad(f"expected a type, found {word!r}")
        low = word.lower()
        self.types.append(low)
        if low == "array":
            self.expect("<")
            self.type()
            self.expect(">")
        elif low == "map":
            self.expect("<")
            self.type()
            self.expect(",")
            self.type()
            self.expect(">")
        elif low == "struct":
            self.expect("<")
            self.columns(">")
            self.expect(">")
        elif low == "interval":
            while (tok := self.peek()) is not None and tok[0] == "word" and tok[1].lower() in (*_INTERVAL_UNITS, "to"):
                self.take()
        elif low in _PARAMETERS:
            least, most = _PARAMETERS[low]
            params = 0
            if self.at("("):
                self.take()
                while True:
                    k, n = self.take()
                    if k != "word" or not n.isdigit():
                        raise _Bad(f"{word}(...) takes whole numbers, found {n!r}")
                    params += 1
                    if not self.at(","):
                        break
                    self.take()
                self.expect(")")
            if not least <= params <= most:
                raise _Bad(
                    f"{word} takes {least if least == most else f'{least} to {most}'} parameter(s), got {params}"
                )
        elif low not in _SIMPLE:
            raise _Bad(f"{word!r} is not a Spark type")


def _parse(ddl: str) -> _Parser:
    p = _Parser(ddl)
    if p.peek() is None:
        raise _Bad("it is empty")
    p.names = p.columns(None)
    if p.peek() is not None:
        raise _Bad(f"unexpected {p.peek()[1]!r} after column {p.names[-1]!r}")  # type: ignore[index]
    return p


_NOT_READ = {"char": "STRING", "character": "STRING", "varchar": "STRING", "void": "STRING"}
"""Types Spark's file readers refuse in a schema (UNSUPPORTED_CHAR_OR_VARCHAR_AS_STRING, VOID), and what to use."""
_NESTED = ("array", "map", "struct")


def problems(ddl: object, *, flat: bool = False) -> str | None:
    """What is wrong with a DDL schema string (None: it parses, and a file reader takes it).
    ``flat``: the reader takes no arrays, maps or structs (CSV)."""
    if not isinstance(ddl, str):
        return f"a schema must be a DDL string such as 'a INT, b STRING', got {type(ddl).__name__}"
    try:
        parsed = _parse(ddl)
    except _Bad as exc:
        return f"{ddl!r} is not a Spark DDL schema ({exc}); write it as 'a INT, b STRING, c DECIMAL(10,2)'"
    names = parsed.names
    bad = sorted({t for t in parsed.types if t in _NOT_READ})
    if bad:
        return (
            f"{ddl!r} uses {', '.join(t.upper() for t in bad)}, which Spark's file readers refuse in a schema; "
            "use STRING"
        )
    nested = [n for n, t in zip(names, parsed.tops, strict=True) if t in _NESTED]
    if flat and nested:
        return (
            f"{ddl!r} makes {', '.join(map(repr, nested))} an array, map or struct, which the CSV reader cannot read; "
            "read it as STRING and parse it in a transform (from_json)"
        )
    dup = sorted({n for n in names if [m.lower() for m in names].count(n.lower()) > 1})
    if dup:
        return f"{ddl!r} names column(s) {', '.join(map(repr, dup))} more than once"
    return None


def column_names(ddl: str) -> list[str]:
    """The top-level column names of a DDL schema that ``problems`` accepts."""
    return _parse(ddl).names


def to_ddl(schema: Any) -> str:
    """A PySpark ``StructType`` as a DDL string (``"`a` int, `b` string"``); a string is
    returned as it is. Nullability is not carried: Spark reads files with every column
    nullable whatever the schema says."""
    if isinstance(schema, str):
        return schema
    fields = getattr(schema, "fields", None)
    if fields is None or not hasattr(schema, "simpleString"):
        raise TypeError(
            f"schema must be a DDL string ('a INT, b STRING') or a pyspark StructType, got {type(schema).__name__}"
        )
    return ", ".join(f"`{f.name.replace('`', '``')}` {f.dataType.simpleString()}" for f in fields)
