"""Reads of many keys in one round trip per server: one pipeline on a single Redis, one per
master on a Redis Cluster (each key's commands on the master serving its slot). For the
tools that look at many streams at once (inspection, ``stats``, the metrics endpoints)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.exceptions import AskError, ClusterDownError, TryAgainError

from sluice.errors import StoreError

from .cluster_backend import ClusterBackend
from .log import EventLog
from .redis_backend import RedisBackend, translate_errors

__all__ = ["client_for", "clients", "pipelined"]


def client_for(log: EventLog, what: str, key: str | None = None) -> redis.Redis:
    """The redis-py client of the server holding ``key`` (on a cluster, its master; with no
    key, the first master); StoreError naming ``what`` for a log on no Redis."""
    backend = log.backend
    if isinstance(backend, RedisBackend):
        return backend.client
    if isinstance(backend, ClusterBackend):
        with translate_errors(what):
            addr = backend.node_of(key) if key is not None else backend.masters()[0]
        return backend.node(addr).client
    raise StoreError(f"{what} needs a Redis server; this log is on a {type(backend).__name__}")


def clients(log: EventLog, what: str, keys: Sequence[str] = ()) -> list[tuple[redis.Redis, list[int]]]:
    """Each server's client with the indices of ``keys`` it holds (every master, on a
    cluster, when ``keys`` is empty: for what every server must answer, e.g. SCAN)."""
    backend = log.backend
    if isinstance(backend, ClusterBackend):
        with translate_errors(what):
            if not keys:
                return [(backend.node(addr).client, []) for addr in backend.masters()]
            return [
                (backend.node(addr).client, [i for ix in by_slot.values() for i in ix])
                for addr, by_slot in backend.by_node(keys).items()
            ]
    return [(client_for(log, what), list(range(len(keys))))]


def pipelined(
    log: EventLog, what: str, keys: Sequence[str], queue: Callable[[Any, int], None], per_key: int = 1
) -> list[Any]:
    """``queue(pipeline, i)`` for each key ``keys[i]`` (queueing ``per_key`` commands on it), sent in one
    pipeline per server; the answers in the order of ``keys`` (an error reply in its place).
    A cluster that redirected some (its map had changed) is read again, once."""
    for attempt in range(2):
        out: list[Any] = [None] * (len(keys) * per_key)
        moved = False
        with translate_errors(what):
            for client, ix in clients(log, what, keys):
                pipe = client.pipeline(transaction=False)
                for i in ix:
                    queue(pipe, i)
                answers = pipe.execute(raise_on_error=False)
                for j, i in enumerate(ix):
                    got = answers[j * per_key : (j + 1) * per_key]
                    out[i * per_key : (i + 1) * per_key] = got
                    moved = moved or any(isinstance(a, (AskError, TryAgainError, ClusterDownError)) for a in got)
        if not moved or attempt:
            return out
        backend = log.backend
        if isinstance(backend, ClusterBackend):
            backend.refresh()
    return out
