"""How keys and state instances are named, shared by the task that writes queryable state
and the client that reads it (pure)."""

from __future__ import annotations

import hashlib

__all__ = ["key_field", "state_id"]


def key_field(key: object) -> str:
    """The text a key is stored under in its state hash: strings as they are, integers in
    decimal, booleans as ``true``/``false``, floats by ``repr``. (The key group is computed
    from the typed key, as Spark hashes it: ``keygroups.key_group_of``.)"""
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, (int, float)):
        return repr(key)
    raise TypeError(f"queryable state keys are strings, integers, floats or booleans, not {type(key).__name__}")


def state_id(job_id: str, name: str, execution_id: str) -> str:
    """The id of one attempt's state under ``name``: opaque (as Flink's KvStateID), and the
    same for the same attempt, so a retried write replaces rather than duplicates."""
    return hashlib.sha1(f"{job_id}\0{name}\0{execution_id}".encode()).hexdigest()[:24]
