"""Read models: tables derived from the log, stored with the position they reflect."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from .backend import ScriptFailed
from .log import EventLog, _s, script_error

__all__ = ["ReadModels"]

_MAX_ROWS_PER_WRITE = 1000


class ReadModels:
    def __init__(self, log: EventLog) -> None:
        self.log = log

    def write(
        self,
        tag: str,
        name: str,
        *,
        expected: str | None,
        position: str,
        rows: Mapping[str, Any],
        deleted: tuple[str, ...] = (),
        server: str = "",
    ) -> bool:
        """Set ``rows`` (JSON values) and delete ``deleted`` in table ``name`` and move its
        position from ``expected`` to ``position``, atomically; False when the stored
        position is not ``expected`` (another projector got there first). ``server``: the
        run id of the server the rows were read from (StoreRestarted if it restarted since:
        the facts they came from may be lost)."""
        keys = [self.log.keys.position(tag, name), self.log.keys.table(tag, name)]
        items = list(rows.items())
        chunks = [items[i : i + _MAX_ROWS_PER_WRITE] for i in range(0, len(items), _MAX_ROWS_PER_WRITE)] or [[]]
        # All chunks but the last keep the position where it is: only the last moves it.
        cur = expected or ""
        for i, chunk in enumerate(chunks):
            last = i == len(chunks) - 1
            nxt = position if last else cur
            args: list[object] = [server, cur, nxt, len(chunk)]
            for k, v in chunk:
                args += (k, orjson.dumps(v))
            if last:
                args += list(deleted)
            try:
                if not self.log.backend.script("project", keys, args):
                    return False
            except ScriptFailed as exc:
                raise script_error(exc, tag) from exc
            cur = nxt
        return True

    def read(self, tag: str, name: str) -> tuple[str | None, dict[str, Any]]:
        """(position, rows) of table ``name``, read together."""
        pos, raw = self.log.backend.get_and_hgetall(self.log.keys.position(tag, name), self.log.keys.table(tag, name))
        return (_s(pos) if pos else None), {_s(k): orjson.loads(v) for k, v in raw.items()}
