"""Short tracebacks for people: the user's own frames and the exception, not the frames of
Sluice, PySpark, py4j or the standard library that the job's code ran under.

The log keeps every error whole (a FAILED task's ``error``, a job's ``reason``); only what
the CLI prints is shortened, with a line saying how many frames were hidden and where the
full traceback is. Pure functions over the traceback's text: the error may come from a
worker on another host, so frames are told apart by their file names.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Iterable
from pathlib import Path

__all__ = ["short_traceback", "short_exception", "internal_roots", "is_internal"]

_FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line \d+, in ')
_THIRD_PARTY = re.compile(r"[/\\](site-packages|dist-packages|pyspark|py4j)[/\\]|pyspark\.zip|py4j-[^/\\]*\.zip")
_STDLIB = re.compile(r"[/\\]lib[/\\]python3(\.\d+)?[/\\]")


def internal_roots() -> tuple[str, ...]:
    """The folders of Sluice's own packages in this installation (with the editable layout,
    sluice/, events/, store/ and services/ are separate folders)."""
    import sluice
    import sluice.events
    import sluice.services
    import sluice.store

    return tuple(
        sorted(
            {
                str(Path(m.__file__ or "").resolve().parent)
                for m in (sluice, sluice.events, sluice.store, sluice.services)
            }
        )
    )


def is_internal(filename: str, roots: Iterable[str]) -> bool:
    """Whether a frame's file belongs to Sluice (under ``roots``), a library or Python
    itself, rather than to the user's code."""
    if filename.startswith("<frozen ") or _THIRD_PARTY.search(filename):
        return True
    if any(filename == r or filename.startswith(r.rstrip("/\\") + "/") for r in roots):
        return True
    return bool(_STDLIB.search(filename))


def short_traceback(text: str, *, hint: str = "", roots: Iterable[str] | None = None) -> str:
    """``text`` with the frames of internal files left out of every traceback in it (chained
    ones included), and one last line saying how many were hidden and ``hint`` (where the
    full one is). A traceback with no frame of the user's keeps its innermost frame, so an
    error of Sluice's own still says where it was raised. Text that holds no traceback
    comes back unchanged."""
    roots = tuple(internal_roots() if roots is None else roots)
    lines = text.splitlines()
    out: list[str] = []
    frames: list[tuple[bool, list[str]]] = []
    hidden = 0

    def flush() -> None:
        nonlocal hidden
        kept = [f for internal, f in frames if not internal] or [frames[-1][1]]
        hidden += len(frames) - len(kept)
        for frame in kept:
            out.extend(frame)
        frames.clear()

    i = 0
    while i < len(lines):
        m = _FRAME.match(lines[i])
        if m is None:
            if frames:
                flush()
            out.append(lines[i])
            i += 1
            continue
        j = i + 1
        while j < len(lines) and (lines[j].startswith("    ") or lines[j].startswith("  [Previous line repeated")):
            j += 1  # the frame's source line, its ^^^ markers, a recursion's repeat count
        frames.append((is_internal(m.group("file"), roots), lines[i:j]))
        i = j
    if frames:
        flush()
    if hidden:
        where = f"; the full traceback: {hint}" if hint else ""
        out.append(f"({hidden} internal frame{'s' if hidden != 1 else ''} of Sluice, Spark and Python hidden{where})")
    return "\n".join(out)


def short_exception(exc: BaseException, *, hint: str = "") -> str:
    """``exc``'s traceback (its causes' too), shortened as ``short_traceback`` does."""
    return short_traceback("".join(traceback.format_exception(exc)).rstrip("\n"), hint=hint)
