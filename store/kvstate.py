"""Queryable state in Redis: one hash per task attempt and registration name (the "state
server" of Flink's KvState, here simply the Redis the task writes to), and the reads the
state client makes (a location row of the KvStateLocation table, one key of one hash).

A state hash holds ``=<key>`` -> the key's value (JSON bytes) and one field ``#`` with
what wrote it (JSON), so even a subtask that owns no key leaves a hash: a missing hash
means the state was retired (its attempt failed, or the job was disposed), not "empty".
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson

from .backend import Backend
from .cluster_backend import open_backend
from .connection import is_cluster_url, parse_cluster_url
from .keys import Keys
from .redis_backend import RedisBackend

__all__ = ["KEY_FIELD_PREFIX", "META_FIELD", "KvStates", "server_address"]

KEY_FIELD_PREFIX = "="
META_FIELD = "#"
TABLE = "kvstate"
"""The KvStateLocation read model's table name (per job, next to ``executiongraph``)."""

_CHUNK = 1000


def server_address(url: str) -> str:
    """The address a registration names: the Redis URL without its password (a reader
    brings its own, from ``$SLUICE_REDIS_PASSWORD``)."""
    if is_cluster_url(url):  # (its password, if any, is in the netloc before the nodes)
        head, at, rest = url.partition("://")[2].rpartition("@")
        return url if not at or ":" not in head else f"{url.partition('://')[0]}://{head.split(':')[0]}@{rest}"
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = (
        (parts.username + "@" if parts.username else "")
        + (parts.hostname or "")
        + (f":{parts.port}" if parts.port else "")
    )
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


class KvStates:
    """Queryable state on one server (``backend``: a Backend, or a redis-py client), keys
    built by ``keys``."""

    def __init__(self, backend: Backend | Any, keys: Keys) -> None:
        self.backend: Backend = backend if isinstance(backend, Backend) else RedisBackend(backend)
        self.keys = keys

    @classmethod
    def at(cls, address: str, keys: Keys, timeout: float = 2.0) -> KvStates:
        """The state server at ``address`` (raises RedisUnavailable when it does not answer)."""
        return cls(open_backend(address, timeout=timeout), keys)

    def serves(self, address: str) -> bool:
        """Whether ``address`` names the server this client talks to (so no new connection)."""
        return _normal(self.backend.address() or "") == _normal(address)

    def key(self, job_id: str, state_id: str) -> str:
        return self.keys.kvstate(self.keys.job(job_id), state_id)

    # --- the task's side ---

    def write(self, job_id: str, state_id: str, items: Iterable[tuple[str, bytes]], meta: dict[str, Any]) -> int:
        """Replace the hash of ``state_id`` with ``items`` (key, value JSON), in chunks;
        returns how many keys were written."""
        key = self.key(job_id, state_id)
        n = 0
        self.backend.delete(key)
        chunk: dict[str, bytes] = {}
        for k, v in items:
            chunk[KEY_FIELD_PREFIX + k] = v
            if len(chunk) >= _CHUNK:
                n += len(chunk)
                self.backend.hset(key, chunk)
                chunk = {}
        n += len(chunk)
        chunk[META_FIELD] = orjson.dumps({**meta, "keys": n})
        self.backend.hset(key, chunk)
        return n

    def delete(self, job_id: str, state_ids: Iterable[str]) -> int:
        """Retire state instances (their attempt failed, or the job was disposed)."""
        keys = [self.key(job_id, s) for s in state_ids]
        return sum(self.backend.delete(*keys[i : i + _CHUNK]) for i in range(0, len(keys), _CHUNK))

    # --- the reader's side ---

    def get(self, state_key: str, key: str) -> bytes | None:
        """One key's value in a state hash (``state_key`` from ``key()``); None if absent."""
        return self.backend.hget(state_key, KEY_FIELD_PREFIX + key)

    def exists(self, state_key: str) -> bool:
        return bool(self.backend.exists(state_key))

    def location(self, job_id: str, name: str) -> dict[str, Any] | None:
        """The KvStateLocation table's row for ``name`` in job ``job_id``."""
        raw = self.backend.hget(self.keys.table(self.keys.job(job_id), TABLE), name)
        return orjson.loads(raw) if raw else None

    def names(self, job_id: str) -> list[str]:
        return sorted(k.decode() for k in self.backend.hkeys(self.keys.table(self.keys.job(job_id), TABLE)))

    def job_exists(self, job_id: str) -> bool:
        return bool(self.backend.exists(self.keys.facts(self.keys.job(job_id))))


def _normal(address: str) -> tuple[str, str, int, int]:
    """(scheme, host or socket path, port, db) of a Redis URL."""
    if is_cluster_url(address):
        return ("cluster", ",".join(sorted(parse_cluster_url(address).seeds)), 0, 0)
    parts = urlsplit(address)
    if parts.scheme == "unix":
        return ("unix", parts.path, 0, 0)
    path = parts.path.strip("/")
    db = int(path) if path.isdigit() else 0
    return ("redis", parts.hostname or "localhost", parts.port or 6379, db)
