"""Whether a task's failure is worth another attempt, decided where the exception is: pure.

Some failures are deterministic: the same input and the same code fail the same way on
every attempt, so restarting only burns the job's restarts and delays its root cause (a
CSV cell ``NA`` that an ANSI cast refuses failed four times before this). Such a failure
is reported ``retryable=False`` (``UpdateTaskExecutionState``), and the leader fails the
job at once, its root cause the error. By default these are:

* a Spark ``AnalysisException`` (or a subclass, such as ``ParseException``): a missing
  column, a type mismatch, a bad expression, found before any data is read;
* a Spark error whose condition (``SparkException.getCondition()``, or ``[CONDITION]`` in
  its message) is a data error: an ANSI cast or arithmetic error (``CAST_INVALID_INPUT``,
  ``DIVIDE_BY_ZERO``, ...), a malformed record under ``mode=FAILFAST``, a schema mismatch;
* an ``ImportError`` or ``SyntaxError`` (the job's code, or a module it imports, is missing
  or broken on this TaskManager).

Everything else (a lost connection, a worker killed, a full disk, a user error we cannot
tell apart from a transient one) stays retryable. The job decides last: ``no_retry_on``
and ``retry_on`` (``Job(..., no_retry_on=[...], retry_on=[...])``) name exception classes
(bare, ``ValueError``, or qualified, ``mymodule.BadRow``; any class of the exception's MRO,
or of the exceptions it was raised from) or Spark conditions; ``no_retry_on`` wins over
``retry_on``, and both over the defaults.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Verdict", "classify", "names_of", "DETERMINISTIC_CONDITIONS"]

DETERMINISTIC_CONDITIONS = frozenset(
    {
        "CAST_INVALID_INPUT",
        "CAST_OVERFLOW",
        "CAST_OVERFLOW_IN_TABLE_INSERT",
        "DIVIDE_BY_ZERO",
        "INTERVAL_DIVIDED_BY_ZERO",
        "ARITHMETIC_OVERFLOW",
        "BINARY_ARITHMETIC_OVERFLOW",
        "NUMERIC_VALUE_OUT_OF_RANGE",
        "NUMERIC_OUT_OF_SUPPORTED_RANGE",
        "INVALID_ARRAY_INDEX",
        "INVALID_ARRAY_INDEX_IN_ELEMENT_AT",
        "INVALID_INDEX_OF_ZERO",
        "INVALID_FRACTION_OF_SECOND",
        "CANNOT_PARSE_TIMESTAMP",
        "CANNOT_PARSE_DECIMAL",
        "MALFORMED_RECORD_IN_PARSING",
        "DATATYPE_MISMATCH",
        "UNRESOLVED_COLUMN",
        "CANNOT_MERGE_SCHEMAS",
        "CANNOT_MERGE_INCOMPATIBLE_DATA_TYPE",
        "PARQUET_COLUMN_DATA_TYPE_MISMATCH",
        "INCOMPATIBLE_DATA_FOR_TABLE",
    }
)
"""Spark error conditions (or parts of one: ``FAILED_READ_FILE.PARQUET_COLUMN_DATA_TYPE_MISMATCH``)
that another attempt on the same data would hit again."""

_DETERMINISTIC_CLASSES = ("AnalysisException", "ImportError", "SyntaxError")
"""Exception classes (by name, so no Spark import is needed) that are deterministic."""

_CONDITION_IN_MESSAGE = re.compile(r"\[([A-Z][A-Z0-9_]*(?:\.[A-Z][A-Z0-9_]*)*)\]")
_CHAIN_LIMIT = 16


@dataclass(frozen=True)
class Verdict:
    """``retryable``; ``why``: one line for the root cause when it is not (None when it is)."""

    retryable: bool
    why: str | None = None


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception and those it was raised from or during, each once."""
    out: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo and len(out) < _CHAIN_LIMIT:
        e = todo.pop(0)
        if e is None or any(e is seen for seen in out):
            continue
        out.append(e)
        todo += [e.__cause__, e.__context__]
    return out


def _conditions(exc: BaseException) -> list[str]:
    """Spark's error conditions of ``exc``: its own (PySpark's errors say it), then any in its message."""
    found: list[str] = []
    # (PySpark 4 names it getCondition, and warns that getErrorClass is deprecated; 3 has only that)
    fn = getattr(exc, "getCondition", None) or getattr(exc, "getErrorClass", None)
    if callable(fn):
        try:
            value = fn()
        except Exception:  # an error object that cannot say: its message may
            value = None
        if isinstance(value, str) and value:
            found.append(value)
    try:
        text = str(exc)
    except Exception:
        text = ""
    found += _CONDITION_IN_MESSAGE.findall(text[:20_000])
    return list(dict.fromkeys(found))


def names_of(exc: BaseException) -> tuple[list[str], list[str]]:
    """(class names, Spark conditions) the failure can be matched by: every class of the MRO
    of every exception in its chain, bare and qualified; every condition, whole and by part."""
    classes: list[str] = []
    conditions: list[str] = []
    for e in _chain(exc):
        for cls in type(e).__mro__:
            if cls is object:
                continue
            classes += [cls.__qualname__, f"{cls.__module__}.{cls.__qualname__}"]
        for cond in _conditions(e):
            conditions += [cond, *cond.split(".")]
    return list(dict.fromkeys(classes)), list(dict.fromkeys(conditions))


def classify(
    exc: BaseException, retry_on: list[str] | tuple[str, ...] = (), no_retry_on: list[str] | tuple[str, ...] = ()
) -> Verdict:
    """Whether another attempt may succeed where this one failed with ``exc``."""
    classes, conditions = names_of(exc)
    names = set(classes) | set(conditions)
    hit = next((n for n in no_retry_on if n in names), None)
    if hit is not None:
        return Verdict(False, f"{hit} is in the job's no_retry_on: the job fails without another attempt")
    if any(n in names for n in retry_on):
        return Verdict(True)
    condition = next((c for c in conditions if c in DETERMINISTIC_CONDITIONS), None)
    if condition is not None:
        whole = next((c for c in conditions if condition in c.split(".") and "." in c), condition)
        return Verdict(
            False,
            f"Spark error {whole} is deterministic (another attempt on the same data fails the same way), so it "
            f"is not retried; fix the data or the code, or list {condition!r} in Job(retry_on=...) to retry it",
        )
    cls = next((c for c in _DETERMINISTIC_CLASSES if c in classes), None)
    if cls is not None:
        return Verdict(
            False,
            f"{cls} is deterministic (another attempt fails the same way), so it is not retried; fix the job, or "
            f"list {cls!r} in Job(retry_on=...) to retry it",
        )
    return Verdict(True)
