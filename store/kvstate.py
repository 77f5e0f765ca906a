"""Queryable state in Redis: one hash per task attempt and registration name (the "state
server" of Flink's KvState, here simply the Redis the task writes to), and the reads the
state client makes (a location row of the KvStateLocation table, one key of one hash).

A state hash holds ``=<key>`` -> the key's value (JSON bytes) and one field ``#`` with
what wrote it (JSON), so even a subtask that owns no key leaves a hash: a missing hash
means the state was retired (its attempt failed, or the job was disposed), not "empty".
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit, urlunsplit

import orjson
import redis

from sluice.errors import RedisUnavailable

from .connection import connect
from .keys import Keys
from .log import translate_errors

__all__ = ["KEY_FIELD_PREFIX", "META_FIELD", "KvStates", "server_address"]

KEY_FIELD_PREFIX = "="
META_FIELD = "#"
TABLE = "kvstate"
"""The KvStateLocation read model's table name (per job, next to ``executiongraph``)."""

_CHUNK = 1000


def server_address(url: str) -> str:
    """The address a registration names: the Redis URL without its password (a reader
    brings its own, from ``$SLUICE_REDIS_PASSWORD``)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = (parts.username + "@" if parts.username else "") + (parts.hostname or "") + (
        f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


class KvStates:
    """Queryable state on one Redis server (``client``), keys built by ``keys``."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client, self.keys = client, keys

    @classmethod
    def at(cls, address: str, keys: Keys, timeout: float = 2.0) -> KvStates:
        """The state server at ``address`` (raises RedisUnavailable when it does not answer)."""
        return cls(connect(address, timeout=timeout), keys)

    def serves(self, address: str) -> bool:
        """Whether ``address`` names the server this client talks to (so no new connection)."""
        kw = self.client.connection_pool.connection_kwargs
        parts = urlsplit(address)
        if parts.scheme == "unix":
            return kw.get("path") == parts.path
        db = int(parts.path.strip("/") or 0) if parts.path.strip("/").isdigit() or not parts.path.strip("/") else -1
        return (kw.get("host"), int(kw.get("port", 6379)), int(kw.get("db", 0))) == (
            parts.hostname, parts.port or 6379, db)

    def key(self, job_id: str, state_id: str) -> str:
        return self.keys.kvstate(self.keys.job(job_id), state_id)

    # --- the task's side ---

    def write(self, job_id: str, state_id: str, items: Iterable[tuple[str, bytes]], meta: dict) -> int:
        """Replace the hash of ``state_id`` with ``items`` (key, value JSON), pipelined in
        chunks; returns how many keys were written."""
        key = self.key(job_id, state_id)
        n = 0
        with translate_errors(f"writing queryable state {state_id} of job {job_id}"):
            self.client.delete(key)
            chunk: dict[str, bytes] = {}
            for k, v in items:
                chunk[KEY_FIELD_PREFIX + k] = v
                if len(chunk) >= _CHUNK:
                    n += len(chunk)
                    self.client.hset(key, mapping=chunk)
                    chunk = {}
            n += len(chunk)
            chunk[META_FIELD] = orjson.dumps({**meta, "keys": n})
            self.client.hset(key, mapping=chunk)
        return n

    def delete(self, job_id: str, state_ids: Iterable[str]) -> int:
        """Retire state instances (their attempt failed, or the job was disposed)."""
        keys = [self.key(job_id, s) for s in state_ids]
        with translate_errors(f"deleting queryable state of job {job_id}"):
            return sum(self.client.delete(*keys[i:i + _CHUNK]) for i in range(0, len(keys), _CHUNK))

    # --- the reader's side ---

    def get(self, state_key: str, key: str) -> bytes | None:
        """One key's value in a state hash (``state_key`` from ``key()``); None if absent."""
        try:
            return self.client.hget(state_key, KEY_FIELD_PREFIX + key)
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            raise RedisUnavailable(f"Redis went away while reading queryable state: {exc}") from exc

    def exists(self, state_key: str) -> bool:
        with translate_errors("reading queryable state"):
            return bool(self.client.exists(state_key))

    def location(self, job_id: str, name: str) -> dict | None:
        """The KvStateLocation table's row for ``name`` in job ``job_id``."""
        with translate_errors(f"reading the KvStateLocation table of job {job_id}"):
            raw = self.client.hget(self.keys.table(self.keys.job(job_id), TABLE), name)
        return orjson.loads(raw) if raw else None

    def names(self, job_id: str) -> list[str]:
        with translate_errors(f"reading the KvStateLocation table of job {job_id}"):
            return sorted(k.decode() for k in self.client.hkeys(self.keys.table(self.keys.job(job_id), TABLE)))

    def job_exists(self, job_id: str) -> bool:
        with translate_errors(f"looking for job {job_id}"):
            return bool(self.client.exists(self.keys.facts(self.keys.job(job_id))))
