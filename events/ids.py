"""What an id may look like: the rules every id that becomes part of a Redis key follows.

A resource id, job id or client id ends up inside a key's hash tag (``{<prefix>:tm:<id>}``),
so it must not hold ``{``, ``}``, glob characters, spaces or newlines, and must stay short.
Cores check ids with these rules before they decide anything, so a hostile or broken
message is refused with a reason instead of failing deep inside a shell; ``store/keys.py``
builds keys with the same rules.
"""

from __future__ import annotations

import re

__all__ = ["ID_RULE", "id_problem", "inbox_problem", "MAX_ID"]

MAX_ID = 128
_ID_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")
ID_RULE = "1-128 letters, digits, '_', '.', ':' or '-'"


def id_problem(value: object, what: str) -> str | None:
    """Why ``value`` cannot be used as ``what`` in a key (None when it can)."""
    if not isinstance(value, str):
        return f"{what} must be a string, got {type(value).__name__}"
    if not _ID_RE.match(value):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"{what} {shown!r} ({len(value)} characters) is not usable in a key: use {ID_RULE}"
    return None


def inbox_problem(prefix: str, key: object, kinds: tuple[str, ...] = ("client",)) -> str | None:
    """Why ``key`` is not the inbox of one of ``kinds`` (client, tm, job) under ``prefix``
    (None when it is): where replies may be sent."""
    if not isinstance(key, str):
        return f"a reply address must be a string, got {type(key).__name__}"
    shown = key if len(key) <= 60 else key[:57] + "..."
    for kind in kinds:
        head = "{" + prefix + ":" + kind + ":"
        if key.startswith(head) and key.endswith("}:inbox"):
            inner = key[len(head) : -len("}:inbox")]
            problem = id_problem(inner, f"the {kind} id of reply address {shown!r}")
            if problem is None:
                return None
            return problem
    wanted = " or ".join("{" + prefix + ":" + k + ":<id>}:inbox" for k in kinds)
    return f"reply address {shown!r} is not an inbox of this cluster (expected {wanted})"
