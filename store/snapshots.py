"""Snapshots: a leader's state folded from one tag's facts, stored with the fact entry id
it covers, so a new leader folds only the facts after it.

A snapshot lives in the tag it describes (``{<p>:job:<id>}:snapshot``, ``{<p>:cluster}:snapshot``),
a hash of ``pos`` and ``data``. It is written by the ``snapshot`` script, fenced like a
commit (a deposed leader's write is refused with StaleEpoch, a writer that has not seen a
restart of the server with StoreRestarted), and the position is read inside the script.
What ``data`` holds, and its schema version, is the writer's business (this module stores
bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

from .backend import ScriptFailed
from .log import EventLog, _s, script_error

__all__ = ["Snapshots", "StoredSnapshot"]


@dataclass(frozen=True, slots=True)
class StoredSnapshot:
    position: str
    """The last fact entry id of the tag folded into ``data`` ('0-0': none)."""
    data: bytes


class Snapshots:
    def __init__(self, log: EventLog) -> None:
        self.log = log

    def write(self, tag: str, epoch: int, data: bytes, *, server: str = "") -> str:
        """Store ``data`` as the snapshot of ``tag``, covering every fact the tag has now;
        returns that position. StaleEpoch when ``epoch`` is behind the tag's fence."""
        keys = self.log.keys
        try:
            pos = self.log.backend.script(
                "snapshot", [keys.fence(tag), keys.facts(tag), keys.snapshot(tag)], [epoch, server, data]
            )
        except ScriptFailed as exc:
            raise script_error(exc, tag, epoch) from exc
        return _s(pos)

    def read(self, tag: str) -> StoredSnapshot | None:
        """The stored snapshot of ``tag`` (None when there is none, or it lacks a field)."""
        raw = self.log.backend.hgetall(self.log.keys.snapshot(tag))
        pos, data = raw.get(b"pos"), raw.get(b"data")
        if pos is None or data is None:
            return None
        return StoredSnapshot(_s(pos), data)

    def delete(self, tag: str) -> None:
        self.log.backend.delete(self.log.keys.snapshot(tag))
