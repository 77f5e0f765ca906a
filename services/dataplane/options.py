"""Reader options: which ones each source format takes, and whether their values can work.

A source's options travel in its ``SourceSpec`` (``options``: text to text, as Spark's reader
options are) from the client through the JobManager to each reader subtask, which hands them
to Spark's reader for every split it reads. They are checked when the job is submitted (by
the client and again by the JobManager, ``services/jobs/validate.py``): an option a format
does not know is refused with the list of the ones it knows, and a value that cannot work
is refused with what to write instead, so nothing fails later on every split. Option names
are Spark's and, as in Spark, case-insensitive; the refusal names the vertex (the caller
prefixes it).

Sluice's own options, not Spark's: ``schema`` (a DDL string, handed to
``DataFrameReader.schema``), ``columns`` (Parquet: a JSON list of column names, read alone)
and ``encoding`` for text (Spark's text reader has none: Sluice decodes the split's bytes).
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Mapping

from sluice.services.dataplane import ddl

__all__ = ["KNOWN", "MODES", "problems", "lookup", "is_true", "whole_files", "transcoded", "parquet_columns"]

MODES = ("PERMISSIVE", "DROPMALFORMED", "FAILFAST")
"""Spark's parse modes for malformed CSV / JSON records."""

_BOOLEAN = "true or false"
_CSV = {
    "header": _BOOLEAN,
    "inferSchema": _BOOLEAN,
    "sep": "one character",
    "quote": "one character, or '' for no quoting",
    "escape": "one character",
    "nullValue": "any text",
    "schema": "a DDL schema",
    "mode": "a parse mode",
    "encoding": "a charset",
    "multiLine": _BOOLEAN,
    "comment": "one character",
    "ignoreLeadingWhiteSpace": _BOOLEAN,
    "ignoreTrailingWhiteSpace": _BOOLEAN,
    "nanValue": "any text",
    "positiveInf": "any text",
    "negativeInf": "any text",
    "emptyValue": "any text",
    "dateFormat": "a date pattern",
    "timestampFormat": "a timestamp pattern",
    "timestampNTZFormat": "a timestamp pattern",
    "enforceSchema": _BOOLEAN,
    "columnNameOfCorruptRecord": "a column name",
    "locale": "a language tag",
    "preferDate": _BOOLEAN,
    "unescapedQuoteHandling": "a handling",
}
_JSON = {
    "schema": "a DDL schema",
    "mode": "a parse mode",
    "encoding": "a charset",
    "multiLine": _BOOLEAN,
    "primitivesAsString": _BOOLEAN,
    "prefersDecimal": _BOOLEAN,
    "allowComments": _BOOLEAN,
    "allowUnquotedFieldNames": _BOOLEAN,
    "allowSingleQuotes": _BOOLEAN,
    "allowNumericLeadingZeros": _BOOLEAN,
    "allowBackslashEscapingAnyCharacter": _BOOLEAN,
    "allowUnquotedControlChars": _BOOLEAN,
    "allowNonNumericNumbers": _BOOLEAN,
    "columnNameOfCorruptRecord": "a column name",
    "dateFormat": "a date pattern",
    "timestampFormat": "a timestamp pattern",
    "timestampNTZFormat": "a timestamp pattern",
    "dropFieldIfAllNull": _BOOLEAN,
    "locale": "a language tag",
}
KNOWN: dict[str, dict[str, str]] = {
    "text": {"encoding": "a charset"},
    "csv": _CSV,
    "json": _JSON,
    "parquet": {"columns": "a JSON list of column names", "datetimeRebaseMode": "a rebase mode"},
    "range": {"start": "an integer", "end": "an integer"},
}
"""Each format's options (Spark's spelling) and what their value is."""

_BOOLEANS = {name for opts in KNOWN.values() for name, what in opts.items() if what == _BOOLEAN}
_ONE_CHAR = {"sep", "escape", "comment"}
_HINTS = {
    "delimiter": " (Sluice spells it 'sep')",
    "nullvalues": " (did you mean 'nullValue'?)",
    "linesep": " (splits are cut at '\\n': another line separator cannot be honoured)",
    "wholetext": " (read with read_text: a split is lines, not whole files)",
}
_REBASE = ("EXCEPTION", "CORRECTED", "LEGACY")
_QUOTE_HANDLING = ("STOP_AT_CLOSING_QUOTE", "BACK_TO_DELIMITER", "STOP_AT_DELIMITER", "SKIP_VALUE", "RAISE_ERROR")


def lookup(options: Mapping[str, object], name: str) -> object | None:
    """An option's value; option names are case-insensitive, as Spark's are."""
    name = name.lower()
    return next((v for k, v in options.items() if str(k).lower() == name), None)


def is_true(options: Mapping[str, object], name: str) -> bool:
    return str(lookup(options, name)).strip().lower() == "true"


def whole_files(format: str, options: Mapping[str, object]) -> bool:
    """Whether the source's files are read whole, one split a file: a CSV or JSON record
    may then span lines (``multiLine``), which byte ranges would cut. Spark does the same
    (its CSV and JSON files are not splittable under ``multiLine``)."""
    return format in ("csv", "json") and is_true(options, "multiLine")


def transcoded(options: Mapping[str, object]) -> bool:
    """Whether a split's bytes are decoded from another charset than UTF-8 when copied."""
    raw = lookup(options, "encoding")
    try:
        return raw is not None and codecs.lookup(str(raw)).name != "utf-8"
    except LookupError:
        return False


def parquet_columns(options: Mapping[str, object]) -> list[str] | None:
    """The ``columns`` option of a Parquet source, decoded (None: every column)."""
    raw = lookup(options, "columns")
    if raw is None:
        return None
    cols = json.loads(str(raw))
    return [str(c) for c in cols]


def _charset_problem(value: str, split_by_lines: bool) -> str | None:
    try:
        codecs.lookup(value)
    except LookupError:
        return "is not a known charset; use one such as 'UTF-8', 'ISO-8859-1' or 'windows-1252'"
    if split_by_lines and "\nA".encode(value, errors="replace") != b"\nA":
        return (
            "is not ASCII-compatible (a newline is not the byte 0x0A), so splits cannot be cut at line ends; "
            "convert the files to UTF-8, or use an ASCII-compatible charset"
        )
    return None


def _value_problem(fmt: str, name: str, value: str, options: Mapping[str, object]) -> str | None:
    """What is wrong with one option's value (None: nothing)."""
    if name in _BOOLEANS:
        if value.strip().lower() not in ("true", "false"):
            return f"must be 'true' or 'false', got {value!r}"
        return None
    if name in _ONE_CHAR or (name == "quote" and value != ""):
        if len(value) != 1:
            return f"must be a single character, got {value!r} ({len(value)} characters); " + (
                "write a tab as '\\t'" if value in ("\\t", "tab") else "for example ',' ';' '|' or '\\t'"
            )
        if name == "sep" and value in ("\n", "\r"):
            return "cannot be a line break: records end at line breaks"
        return None
    if name == "mode":
        if value.upper() not in MODES:
            return f"is {value!r}; use one of {', '.join(MODES)}"
        return None
    if name == "schema":
        problem = ddl.problems(value, flat=fmt == "csv")
        return None if problem is None else f"(a schema): {problem}"
    if name == "encoding":
        return _charset_problem(value, not whole_files(fmt, options))
    if name == "columns":
        try:
            cols = json.loads(value)
        except ValueError:
            cols = None
        if not isinstance(cols, list) or not cols or not all(isinstance(c, str) and c for c in cols):
            return f'must be a JSON list of column names such as \'["a", "b"]\', got {value!r}'
        dup = sorted({c for c in cols if cols.count(c) > 1})
        if dup:
            return f"names column(s) {', '.join(map(repr, dup))} more than once"
        return None
    if name == "datetimeRebaseMode" and value.upper() not in _REBASE:
        return f"is {value!r}; use one of {', '.join(_REBASE)}"
    if name == "unescapedQuoteHandling" and value.upper() not in _QUOTE_HANDLING:
        return f"is {value!r}; use one of {', '.join(_QUOTE_HANDLING)}"
    if name in ("start", "end"):
        try:
            int(value)
        except ValueError:
            return f"must be an integer, got {value!r}"
    return None


def problems(fmt: str, options: Mapping[str, object]) -> list[str]:
    """What is wrong with a ``fmt`` source's ``options``, each as "option X ..." (the caller
    says which vertex). An unknown format is the caller's to report (nothing here)."""
    known = KNOWN.get(fmt)
    if known is None:
        return []
    if not isinstance(options, Mapping):
        return [f"options must be a dict of text to text, got {type(options).__name__}"]
    by_lower = {k.lower(): k for k in known}
    out: list[str] = []
    seen: dict[str, str] = {}
    for raw, value in options.items():
        name = by_lower.get(str(raw).lower())
        if name is None:
            out.append(
                f"option {raw!r} is not a {fmt} reader option{_HINTS.get(str(raw).lower(), '')}; "
                f"known: {', '.join(sorted(known, key=str.lower))}"
            )
            continue
        if name in seen:
            out.append(f"option {name!r} is given twice ({seen[name]!r} and {raw!r}); give it once")
            continue
        seen[name] = str(raw)
        if not isinstance(value, str):
            out.append(f"option {raw!r} must be text, got {type(value).__name__} {value!r}")
            continue
        problem = _value_problem(fmt, name, value, options)
        if problem:
            out.append(f"option {raw!r} {problem}")
    if fmt == "range":
        for name in ("start", "end"):
            if name not in seen:
                out.append(f"option {name!r} is missing: a range source needs integer options start and end")
    sep, quote = lookup(options, "sep"), lookup(options, "quote")
    if fmt == "csv" and isinstance(sep, str) and sep and sep == quote:
        out.append(f"options 'sep' and 'quote' are both {sep!r}; they must differ")
    return out
