"""Raw copies of the log, entry ids kept: what ``sluice job export``/``import`` and
``sluice replay --into`` read and write.

An export holds entries as they were (fields undecoded); an import writes them back under
another prefix with their own ids (``XADD`` with an explicit id, in order), so the copy
orders, folds and prints exactly as the original. Only a prefix that holds no key yet
may be written: ``keys_under`` says what is already there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import redis

from sluice.errors import IdsOutOfOrder, StoreError

from .backend import Delegating
from .cluster_backend import ClusterBackend
from .log import EventLog
from .redis_backend import RedisBackend, translate_errors

__all__ = ["keys_under", "append_with_ids", "IdsOutOfOrder"]

_BATCH = 500


def _clients(log: EventLog, key: str | None = None) -> list[Any]:
    """The redis-py client of the server (on a Redis Cluster: of the master serving ``key``,
    or of every master when no key is given)."""
    backend = log.backend
    while isinstance(backend, Delegating):
        backend = backend.inner
    if isinstance(backend, ClusterBackend):
        with translate_errors("reading the cluster's slot map"):
            masters = [backend.node_of(key)] if key is not None else backend.masters()
        return [backend.node(addr).client for addr in masters]
    if not isinstance(backend, RedisBackend):
        raise StoreError(f"copying entries with their ids needs a real Redis, not a {type(backend).__name__}")
    return [backend.client]


def keys_under(log: EventLog, *, limit: int = 5) -> list[str]:
    """Up to ``limit`` keys under the log's prefix (sorted; empty: the prefix is free)."""
    found: list[str] = []
    with translate_errors(f"looking for keys under prefix {log.keys.prefix!r}"):
        for client in _clients(log):
            for key in client.scan_iter(match=log.keys.pattern, count=1000):
                found.append(key.decode() if isinstance(key, bytes) else str(key))
                if len(found) >= limit:
                    return sorted(found)
    return sorted(found)


def append_with_ids(log: EventLog, stream: str, entries: Iterable[tuple[str, Mapping[bytes, bytes]]]) -> int:
    """Append ``entries`` ((entry id, fields), ids increasing) to ``stream`` with their own
    ids, in batches of one round trip each; how many were written. IdsOutOfOrder when an id
    is not above the stream's last (callers check the order first: this is the backstop)."""
    (client,) = _clients(log, stream)
    written = 0
    batch: list[tuple[str, Mapping[bytes, bytes]]] = []

    def flush() -> None:
        nonlocal written
        if not batch:
            return
        pipe = client.pipeline(transaction=False)
        for entry_id, fields in batch:
            pipe.xadd(stream, dict(fields), id=entry_id)
        try:
            with translate_errors(f"writing {len(batch)} entries to {stream}"):
                pipe.execute()
        except redis.ResponseError as exc:
            raise IdsOutOfOrder(
                f"cannot write entry {batch[0][0]}..{batch[-1][0]} to {stream}: {exc} "
                "(entry ids must grow within a stream)"
            ) from exc
        written += len(batch)
        batch.clear()

    for entry_id, fields in entries:
        batch.append((entry_id, fields))
        if len(batch) >= _BATCH:
            flush()
    flush()
    return written
