"""The log on a Redis Cluster: each call goes to the master that serves its keys' slot.

Every key Sluice writes carries a hash tag, and one commit (one script) touches the keys
of one tag only (store/keys.py), so every script and every transaction runs on one node.
This backend keeps the cluster's slot map (``CLUSTER SLOTS``) and one
:class:`~sluice.store.redis_backend.RedisBackend` per master, and routes on the slot
itself: the commit path stays the single-node backend's (its own pooled connections and
RESP parsing, measured against redis-py's ``RedisCluster`` in ``scripts/bench
cluster-log``).

Redirections and failures:

* ``MOVED`` (the slot is served elsewhere: a failover, a resharding): the map is read
  again and the call goes again to the new owner. Safe for any call, a commit too: a node
  that redirects has not run the command.
* ``ASK`` (a slot in migration): the call goes once to the importing node, after ASKING.
* ``TRYAGAIN`` and ``CLUSTERDOWN`` (nothing ran): tried again a few times, a moment
  apart, then RedisUnavailable.
* A connection lost mid-call: RedisUnavailable, as on one node (a commit whose reply was
  lost may have landed: it is never re-sent blindly; the caller recovers by reading the
  log), and the map is read again at the next call.

Calls that span tags are split per slot and sent per node in one round trip
(``xadd_many``, ``script_many``, ``exists``, ``delete``, reads of many streams). A blocking
read of streams in several slots (the leader's read of the cluster inbox and every job's
inbox) first reads all of them without blocking; when none has anything, it blocks on
each slot's streams at once, one connection each, and the first that returns unblocks the
others (``CLIENT UNBLOCK``), whose entries are kept: no entry read is dropped.

The server id of a cluster names each master's address and run id (``c<digest>:host:port=run
id,...``): a
failover (a replica promoted, its master's unreplicated writes lost) or a restart of any
master changes it. A script's argument that is such an id is replaced, on the node that
runs the script, by that node's run id when it is one of the masters the id names (else
the script sees a stale id and refuses: ``SLUICE_RESTARTED``, rewritten to name the
cluster's current id).
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar
from urllib.parse import quote

import redis
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import AskError, ClusterDownError, MovedError, TryAgainError
from redis.retry import Retry

from sluice.errors import ConfigError, PartlyAppended, PartlyRead, RedisUnavailable, StoreError

from . import scripts
from .backend import Backend, Fields, GroupState, RawEntry, ScriptCall, ScriptFailed
from .connection import PASSWORD_ENV, ClusterURL, parse_cluster_url, redact
from .redis_backend import (
    RedisBackend,
    asking,
    others_pending,
    read_reply,
    refusal,
    translate_errors,
    xadd_command,
    xread_command,
    xreadgroup_command,
)
from .shards import identity, master_part

__all__ = ["ClusterBackend", "open_backend", "is_cluster_server_id", "server_masters", "REDIRECTS"]

T = TypeVar("T")

_SERVER_ID = re.compile(r"c[0-9a-f]{7}:")
"""How a cluster's server id begins: ``c`` and 7 hex digits of a digest of the rest (so
that its first 8 characters, as logs show a run id, tell two apart), then ``:`` and
``host:port@<slot ranges>=<run id>:<master_replid>`` of each master, by slot, joined by
commas (store/shards.py ``master_part``)."""


def is_cluster_server_id(value: object) -> bool:
    """Whether ``value`` is a Redis Cluster's server id (``ClusterBackend.server_id``)."""
    return isinstance(value, str) and value[:1] == "c" and _SERVER_ID.match(value) is not None


REDIRECTS = 5
"""How many redirections (MOVED, ASK, TRYAGAIN, CLUSTERDOWN) one call follows at most."""

_TRY_AGAIN_S = 0.05
_SLOTS = 16384

Read = list[tuple[str, str, Fields | None]]


def _redirection(exc: BaseException) -> redis.ResponseError | None:
    """The cluster's redirection (or TRYAGAIN, CLUSTERDOWN) that ``exc`` is, or was raised from."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, (AskError, TryAgainError, ClusterDownError)):
            return seen
        seen = seen.__cause__
    return None


def _addr(host: str | bytes, port: int) -> str:
    return f"{host.decode() if isinstance(host, bytes) else host}:{int(port)}"


def server_masters(server: str) -> dict[str, str]:
    """The masters a cluster's server id names: ``host:port`` -> identity (``run id:replication
    id``; so a failover can be told apart per shard: the masters whose identity changed, or
    that are gone; their slots: store/shards.py ``failed_slots``)."""
    out = {}
    for part in server[9:].split(","):
        head, eq, ident = part.partition("=")
        if eq:
            out[head.partition("@")[0]] = ident
    return out


class ClusterBackend(Backend):
    """A Redis Cluster reached through its seed nodes (``redis+cluster://h:p,h:p``)."""

    def __init__(self, url: str, *, timeout: float = 5.0, check: bool = True) -> None:
        self.url = url
        self.parsed: ClusterURL = parse_cluster_url(url)
        self._timeout = timeout
        self._lock = threading.Lock()
        self._nodes: dict[str, RedisBackend] = {}
        self._slots: list[str | None] = [None] * _SLOTS
        self._masters: list[str] = []
        """Masters by the first slot they serve."""
        self._ranges: dict[str, list[tuple[int, int]]] = {}
        """The slot ranges each master serves."""
        self._stale = True
        self._refreshed = 0.0
        self._answered: str | None = None
        """The node that last answered for the slot map (asked first next time: a dead
        master, first in the list, would cost a connection timeout at every refresh)."""
        self._slot_of: dict[str, int] = {}
        self._server_ids: dict[str, dict[str, str]] = {}
        self._pool: ThreadPoolExecutor | None = None
        self.redirections = 0
        """How many redirections calls followed (for tests and benchmarks)."""
        if check:
            self.refresh()

    # --- the map --------------------------------------------------------------------------

    def _client(self, addr: str) -> RedisBackend:
        node = self._nodes.get(addr)
        if node is None:
            with self._lock:
                node = self._nodes.get(addr)
                if node is None:
                    host, _, port = addr.rpartition(":")
                    p = self.parsed
                    kwargs: dict[str, Any] = {
                        "host": host,
                        "port": int(port),
                        "socket_connect_timeout": self._timeout,
                        "health_check_interval": 30,
                        "retry": Retry(NoBackoff(), 0),
                        "username": p.username,
                        "password": p.password or (os.environ.get(PASSWORD_ENV) if p.password is None else None),
                    }
                    if p.tls:
                        kwargs["ssl"] = True
                    node = self._nodes[addr] = RedisBackend(redis.Redis(**kwargs))
        return node

    def refresh(self) -> None:
        """Read the slot map again from the first node that answers (the one that answered
        last, the known masters, the seeds, then any node met)."""
        tried: list[str] = []
        first = [self._answered] if self._answered else []
        candidates = list(dict.fromkeys([*first, *self._masters, *self.parsed.seeds, *self._nodes]))
        for addr in candidates:
            try:
                with translate_errors(f"reading the slot map from {addr}"):
                    reply = self._client(addr).client.execute_command("CLUSTER SLOTS")
            except RedisUnavailable as exc:
                tried.append(f"{addr} ({exc.__cause__ or exc})")
                continue
            except redis.AuthenticationError as exc:
                raise RedisUnavailable(
                    f"Redis Cluster node {addr} refused our credentials ({exc}); check the URL's user "
                    f"and ${PASSWORD_ENV}",
                    url=redact(self.url),
                ) from exc
            except redis.ResponseError as exc:
                if "cluster support disabled" in str(exc).lower():
                    raise ConfigError(
                        f"{addr} is a Redis without cluster mode; use redis://{addr} (not redis+cluster://) "
                        "for a single Redis"
                    ) from exc
                tried.append(f"{addr} ({exc})")
                continue
            host = addr.rpartition(":")[0]
            slots: list[str | None] = [None] * _SLOTS
            firsts: dict[str, int] = {}
            ranges: dict[str, list[tuple[int, int]]] = {}
            for begin, end, master, *_ in reply:
                owner = _addr(master[0] or host, master[1])
                slots[begin : end + 1] = [owner] * (end - begin + 1)
                firsts[owner] = min(firsts.get(owner, _SLOTS), int(begin))
                ranges.setdefault(owner, []).append((int(begin), int(end)))
            self._slots = slots
            self._masters = sorted(firsts, key=firsts.__getitem__)
            self._ranges = {owner: sorted(spans) for owner, spans in ranges.items()}
            self._answered = addr
            self._stale, self._refreshed = False, time.monotonic()
            return
        self._stale = True
        raise RedisUnavailable(
            f"no node of the Redis Cluster {redact(self.url)} answers: {'; '.join(tried)}; is the cluster running?",
            url=redact(self.url),
        )

    def _slot(self, key: str) -> int:
        slot = self._slot_of.get(key)
        if slot is None:
            slot = key_slot(key.encode())
            if len(self._slot_of) > 100_000:
                self._slot_of.clear()
            self._slot_of[key] = slot
        return slot

    def _owner(self, slot: int) -> str:
        if self._stale and time.monotonic() - self._refreshed > 0.05:
            self.refresh()
        owner = self._slots[slot]
        if owner is None:
            self.refresh()
            owner = self._slots[slot]
            if owner is None:
                raise RedisUnavailable(f"no master of the Redis Cluster {redact(self.url)} serves slot {slot}")
        return owner

    def node_of(self, key: str) -> str:
        """The address (host:port) of the master serving ``key``."""
        return self._owner(self._slot(key))

    def masters(self) -> list[str]:
        """The masters' addresses, by the first slot each serves."""
        if self._stale:
            self.refresh()
        return list(self._masters)

    def node(self, addr: str) -> RedisBackend:
        """The single-node backend of one node (for tools that read each master)."""
        return self._client(addr)

    # --- routing --------------------------------------------------------------------------

    def _route(self, key: str, call: Callable[[RedisBackend], T]) -> T:
        """``call`` on the node serving ``key``, following redirections."""
        slot = self._slot(key)
        target: str | None = None
        ask = False
        for _ in range(REDIRECTS):
            addr = target or self._owner(slot)
            try:
                if ask:
                    with asking():
                        return call(self._client(addr))
                return call(self._client(addr))
            except RedisUnavailable:
                self._stale = True
                raise
            except (StoreError, redis.ResponseError) as exc:
                target, ask = self._follow(exc, slot)
        raise RedisUnavailable(f"the Redis Cluster {redact(self.url)} kept redirecting a call on {key}")

    def _follow(self, exc: BaseException, slot: int | None) -> tuple[str | None, bool]:
        """Where a redirected call goes next, and whether after ASKING (re-raises anything else)."""
        moved = _redirection(exc)
        if moved is None:
            raise exc
        self.redirections += 1
        if isinstance(moved, MovedError):
            self._stale = True
            if slot is not None:
                self._slots[moved.slot_id] = _addr(moved.host, moved.port)
            return None, False
        if isinstance(moved, AskError):
            return _addr(moved.host, moved.port), True
        time.sleep(_TRY_AGAIN_S)  # TRYAGAIN, CLUSTERDOWN: nothing ran; a moment, then again
        self._stale = True
        return None, False

    def by_node(self, keys: Sequence[str]) -> dict[str, dict[int, list[int]]]:
        """Indices of ``keys`` grouped by the node that serves them, then by slot (in order)."""
        out: dict[str, dict[int, list[int]]] = {}
        for i, key in enumerate(keys):
            slot = self._slot(key)
            out.setdefault(self._owner(slot), {}).setdefault(slot, []).append(i)
        return out

    # --- the server -----------------------------------------------------------------------

    def server_id(self) -> str:
        """Every master with the slots it serves and its identity, run id and replication id
        (``INFO server``, ``INFO replication``): a promoted replica has a run id of its own and
        starts a new replication id (store/shards.py)."""
        self.refresh()
        ids = []
        for addr in self._masters:
            node = self._client(addr)
            try:
                with translate_errors(f"reading the identity of {addr}"):
                    pipe = node.client.pipeline(transaction=False)
                    pipe.info("server")
                    pipe.info("replication")
                    server, replication = pipe.execute()
            except RedisUnavailable:
                self._stale = True
                raise
            ident = identity(str(server["run_id"]), str(replication["master_replid"]))
            ids.append(master_part(addr, self._ranges.get(addr, []), ident))
        masters = ",".join(ids)
        return f"c{hashlib.sha1(masters.encode()).hexdigest()[:7]}:{masters}"

    def _run_ids(self, server: str) -> dict[str, str]:
        found = self._server_ids.get(server)
        if found is None:
            found = server_masters(server)
            if len(self._server_ids) > 16:
                self._server_ids.clear()
            self._server_ids[server] = found
        return found

    def _for_node(self, addr: str, args: Sequence[Any]) -> Sequence[Any]:
        """``args`` with a cluster server id replaced by the identity it names for ``addr``
        (itself when it names none: the script sees an identity that is not the node's)."""
        if not any(is_cluster_server_id(a) for a in args):
            return args
        return [self._run_ids(a).get(addr, a) if is_cluster_server_id(a) else a for a in args]

    def _restarted(self, failed: ScriptFailed) -> ScriptFailed:
        """A node's SLUICE_RESTARTED naming the cluster's server id now instead of its run id."""
        if not failed.text.startswith(scripts.RESTARTED + " "):
            return failed
        try:
            now = self.server_id()
        except RedisUnavailable:
            return failed
        again = ScriptFailed(f"{scripts.RESTARTED} {now}")
        again.__cause__ = failed
        return again

    def time_ms(self) -> int:
        return self._each_master(lambda node: node.time_ms(), first=True)[0]

    def _each_master(self, call: Callable[[RedisBackend], T], *, first: bool = False) -> list[T]:
        """``call`` on every master (``first``: the first only). A master that does not answer
        makes the slot map stale, so the next call asks it again: after a failover the dead
        master is no longer among them (without this, a call that names no key, as the
        worker's first round trip, would ask the dead master for good)."""
        out = []
        for addr in self.masters()[:1] if first else self.masters():
            try:
                out.append(call(self._client(addr)))
            except RedisUnavailable:
                self._stale = True
                raise
        return out

    def describe(self) -> str:
        return redact(self.url)

    def address(self) -> str | None:
        """The cluster's URL without its password (a reader brings its own, from
        ``$SLUICE_REDIS_PASSWORD``), as a single Redis's address is given."""
        p = self.parsed
        scheme = "rediss+cluster" if p.tls else "redis+cluster"
        user = f"{quote(p.username)}@" if p.username else ""
        return f"{scheme}://{user}{','.join(p.seeds)}"

    def durable(self) -> bool:
        """Never: a failover promotes a replica that may miss writes its master acknowledged
        (replication is asynchronous), whatever the masters' ``appendfsync``."""
        return False

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        for node in self._nodes.values():
            node.close()

    # --- strings and hashes ---------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        return self._route(key, lambda n: n.get(key))

    def set(self, key: str, value: bytes, *, nx: bool = False) -> bool:
        return self._route(key, lambda n: n.set(key, value, nx=nx))

    def exists(self, *keys: str) -> int:
        return sum(self._each_slot(keys, lambda n, part: n.exists(*part)))

    def delete(self, *keys: str) -> int:
        return sum(self._each_slot(keys, lambda n, part: n.delete(*part)))

    def _each_slot(self, keys: Sequence[str], call: Callable[[RedisBackend, list[str]], T]) -> list[T]:
        """``call(node, keys of one slot)`` for each slot's keys, on the node serving it."""
        out = []
        for ix in self._slots_of(keys):
            part = [keys[i] for i in ix]
            out.append(self._route(part[0], _bound(call, part)))
        return out

    def _slots_of(self, keys: Sequence[str]) -> Iterator[list[int]]:
        groups: dict[int, list[int]] = {}
        for i, key in enumerate(keys):
            groups.setdefault(self._slot(key), []).append(i)
        yield from groups.values()

    def hget(self, key: str, field: str) -> bytes | None:
        return self._route(key, lambda n: n.hget(key, field))

    def hgetall(self, key: str) -> dict[bytes, bytes]:
        return self._route(key, lambda n: n.hgetall(key))

    def hkeys(self, key: str) -> list[bytes]:
        return self._route(key, lambda n: n.hkeys(key))

    def hset(self, key: str, mapping: Mapping[str, bytes]) -> int:
        return self._route(key, lambda n: n.hset(key, mapping))

    def hdel(self, key: str, *fields: str) -> int:
        return self._route(key, lambda n: n.hdel(key, *fields))

    def get_and_hgetall(self, key: str, hash_key: str) -> tuple[bytes | None, dict[bytes, bytes]]:
        self._one_slot(key, hash_key)
        return self._route(key, lambda n: n.get_and_hgetall(key, hash_key))

    def hgetall_with_ttl(self, key: str) -> tuple[dict[bytes, bytes], int]:
        return self._route(key, lambda n: n.hgetall_with_ttl(key))

    def _one_slot(self, *keys: str) -> None:
        if len({self._slot(k) for k in keys}) > 1:
            raise StoreError(f"{', '.join(keys)} are in different hash slots: one transaction cannot read them")

    # --- streams --------------------------------------------------------------------------

    def xadd(self, stream: str, fields: Mapping[bytes, bytes], *, maxlen: int | None = None) -> str:
        return self._route(stream, lambda n: n.xadd(stream, fields, maxlen=maxlen))

    def xadd_many(self, items: Sequence[tuple[str, Mapping[bytes, bytes]]]) -> list[str]:
        """Per slot, in order, one transaction each (a reader of one tag sees all of that
        tag's entries or none: a transaction cannot span slots), each master's in one round
        trip (the leader's heartbeat to every TaskManager)."""
        if not items:
            return []
        ids: list[str | None] = [None] * len(items)
        errors: dict[int, str] = {}
        again: list[list[int]] = []  # slots redirected: one by one, following the redirection
        for addr, by_slot in self.by_node([s for s, _ in items]).items():
            blocks = list(by_slot.values())
            commands: list[Sequence[Any]] = []
            for ix in blocks:
                appends = [xadd_command(items[i][0], items[i][1], None) for i in ix]
                commands += appends if len(ix) == 1 else [("MULTI",), *appends, ("EXEC",)]
            try:
                replies = self._client(addr)._raw(
                    f"appending to {items[blocks[0][0]][0]} and others", commands, check=False
                )
            except RedisUnavailable:
                self._stale = True
                raise
            at = 0
            for ix in blocks:
                if len(ix) == 1:
                    got: list[Any] = [replies[at]]
                    at += 1
                    moved = isinstance(got[0], redis.ResponseError) and _redirection(got[0]) is not None
                else:
                    queued, done = replies[at + 1 : at + 1 + len(ix)], replies[at + 1 + len(ix)]
                    at += len(ix) + 2
                    refused = [q for q in (*queued, done) if isinstance(q, redis.ResponseError)]
                    moved = any(_redirection(q) is not None for q in refused)
                    if not moved and refused:  # refused before it ran (aborted): nothing of it was appended
                        raise refusal(refused[0]) from refused[0]
                    got = [] if moved else list(done)
                if moved:
                    self._follow(got[0] if len(ix) == 1 else next(q for q in refused if _redirection(q)), None)
                    again.append(ix)
                    continue
                for i, reply in zip(ix, got):
                    if isinstance(reply, redis.ResponseError):
                        if not str(reply).startswith("WRONGTYPE"):  # READONLY, OOM: the caller sends all again
                            raise refusal(reply) from reply
                        errors[i] = str(reply)
                    else:
                        ids[i] = reply.decode() if isinstance(reply, bytes) else str(reply)
        for ix in again:
            part = [items[i] for i in ix]
            try:
                sent: Sequence[str | None] = self._route(part[0][0], partial(RedisBackend.xadd_many, items=part))
            except PartlyAppended as exc:
                sent = exc.ids
                errors.update((ix[j], text) for j, text in exc.errors.items())
            for i, entry in zip(ix, sent):
                ids[i] = entry
        if errors:
            raise PartlyAppended(ids, errors)
        return [i for i in ids if i is not None]

    def xrange(self, stream: str, after: str | None, count: int) -> list[RawEntry]:
        return self._route(stream, lambda n: n.xrange(stream, after, count))

    def last_id(self, stream: str) -> str | None:
        return self._route(stream, lambda n: n.last_id(stream))

    def xlen(self, stream: str) -> int:
        return self._route(stream, lambda n: n.xlen(stream))

    def xtrim_minid(self, stream: str, minid: str) -> int:
        return self._route(stream, lambda n: n.xtrim_minid(stream, minid))

    def scan_streams(self, pattern: str) -> list[str]:
        return sorted({k for found in self._each_master(lambda node: node.scan_streams(pattern)) for k in found})

    def scan_keys(self, pattern: str) -> list[str]:
        return sorted({k for found in self._each_master(lambda node: node.scan_keys(pattern)) for k in found})

    # --- reads of many streams ------------------------------------------------------------

    def xread(self, positions: Mapping[str, str], *, count: int, block_ms: int | None) -> list[tuple[str, str, Fields]]:
        if not positions:
            return []
        streams = list(positions)
        slots = list(self._slots_of(streams))
        if len(slots) == 1:
            return self._route(streams[0], lambda n: n.xread(positions, count=count, block_ms=block_ms))

        def command(part: list[str], block: int | None) -> list[Sequence[Any]]:
            return [xread_command({s: positions[s] for s in part}, count, block)]

        try:
            got, _ = self._read_once(streams, command)
        except PartlyRead as exc:  # (XREAD takes nothing: what other slots gave is read again)
            raise exc.refused from exc
        if not got and block_ms:
            got, _ = self._block(streams, command, block_ms)
        return [(s, i, f) for s, i, f in got if f is not None]

    def xreadgroup(
        self,
        group: str,
        consumer: str,
        streams: Mapping[str, str],
        *,
        count: int,
        block_ms: int | None,
        ack: Mapping[str, Sequence[str]] | None = None,
    ) -> list[tuple[str, str, Fields | None]]:
        return self._xreadgroup(group, consumer, streams, count, block_ms, ack, sole=False)[0]

    def xreadgroup_sole(
        self,
        group: str,
        consumer: str,
        streams: Mapping[str, str],
        *,
        count: int,
        block_ms: int | None,
        ack: Mapping[str, Sequence[str]] | None = None,
    ) -> tuple[list[tuple[str, str, Fields | None]], dict[str, int]]:
        return self._xreadgroup(group, consumer, streams, count, block_ms, ack, sole=True)

    def _xreadgroup(
        self,
        group: str,
        consumer: str,
        streams: Mapping[str, str],
        count: int,
        block_ms: int | None,
        ack: Mapping[str, Sequence[str]] | None,
        *,
        sole: bool,
    ) -> tuple[Read, dict[str, int]]:
        acks = {s: ids for s, ids in (ack or {}).items() if ids}
        names = list(streams)
        if len(list(self._slots_of([*names, *acks]))) == 1:
            key = names[0] if names else next(iter(acks))
            return self._route(
                key,
                lambda n: (
                    n.xreadgroup_sole(group, consumer, streams, count=count, block_ms=block_ms, ack=acks)
                    if sole
                    else (n.xreadgroup(group, consumer, streams, count=count, block_ms=block_ms, ack=acks), {})
                ),
            )
        if acks:  # each node's acknowledgements, in one round trip (a refused one had nothing left to do)
            for addr, by_slot in self.by_node(list(acks)).items():
                keys = list(acks)
                commands = [("XACK", keys[i], group, *acks[keys[i]]) for ix in by_slot.values() for i in ix]
                self._client(addr)._raw("acknowledging on " + ", ".join(keys), commands, check=False)
        if not names:
            return [], {}

        def command(part: list[str], block: int | None) -> list[Sequence[Any]]:
            read = xreadgroup_command(group, consumer, {s: streams[s] for s in part}, count, block)
            return [read, *(("XPENDING", s, group) for s in part)] if sole else [read]

        # Every slot's read without blocking, each node's in one round trip; then, if none
        # gave anything (nor did another consumer hold any), every slot's blocking at once.
        got, summaries = self._read_once(names, command)
        others = self._others(consumer, summaries) if sole else {}
        if not got and not others and block_ms:
            got, summaries = self._block(names, command, block_ms)
            others = self._others(consumer, summaries) if sole else {}
        return got, others

    @staticmethod
    def _others(consumer: str, summaries: list[tuple[list[str], list[Any]]]) -> dict[str, int]:
        others: dict[str, int] = {}
        for part, replies in summaries:
            others.update(others_pending(consumer, part, replies))
        return others

    def _read_once(
        self, streams: list[str], command: Callable[[list[str], int | None], list[Sequence[Any]]]
    ) -> tuple[Read, list[tuple[list[str], list[Any]]]]:
        """Each slot's read of its ``streams``, without blocking, each node's in one round
        trip. A slot that refuses its read (WRONGTYPE, NOGROUP) fails the call, with what
        the other slots gave (PartlyRead) when they gave anything."""
        got: Read = []
        after: list[tuple[list[str], list[Any]]] = []
        todo = streams
        for _ in range(REDIRECTS):
            refused: StoreError | None = None
            moved: list[str] = []
            for addr, by_slot in self.by_node(todo).items():
                parts = [[todo[i] for i in ix] for ix in by_slot.values()]
                batches = [command(part, None) for part in parts]
                try:
                    replies = self._client(addr)._raw(
                        "reading " + ", ".join(p[0] for p in parts), [c for b in batches for c in b], check=False
                    )
                except RedisUnavailable:
                    self._stale = True
                    if got:  # taken from other nodes: they must reach the reader
                        raise PartlyRead(RedisUnavailable(f"a node of {redact(self.url)} went away"), got) from None
                    raise
                at = 0
                for part, batch in zip(parts, batches):
                    read, rest = replies[at], replies[at + 1 : at + len(batch)]
                    at += len(batch)
                    if isinstance(read, redis.ResponseError):
                        if _redirection(read) is not None:
                            self._follow(read, self._slot(part[0]))
                            moved += part
                        else:
                            refused = refused or refusal(read)
                        continue
                    got += read_reply(read)
                    after.append((part, rest))
            if refused is not None:
                if got:
                    raise PartlyRead(refused, got) from refused
                raise refused
            if not moved:
                return got, after
            todo = moved
        raise RedisUnavailable(f"the Redis Cluster {redact(self.url)} kept redirecting a read of {streams[0]}, ...")

    def _block(
        self, streams: list[str], command: Callable[[list[str], int | None], list[Sequence[Any]]], block_ms: int
    ) -> tuple[Read, list[tuple[list[str], list[Any]]]]:
        """Each slot's read blocking on its own connection, all at once; the first to return
        with entries unblocks the others (CLIENT UNBLOCK: what they were given meanwhile
        is kept, so nothing is read and dropped)."""
        jobs = [(addr, [streams[i] for i in ix]) for addr, by in self.by_node(streams).items() for ix in by.values()]
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=256, thread_name_prefix="sluice-cluster-read")
        state = _Blocked()
        futures = [self._pool.submit(self._block_one, addr, part, command, block_ms, state) for addr, part in jobs]
        got: Read = []
        after: list[tuple[list[str], list[Any]]] = []
        error: BaseException | None = None
        for future in futures:
            try:
                read, rest = future.result()
            except BaseException as exc:  # noqa: BLE001 (raised below, once every read has ended)
                error = error or exc
                state.stop(self)
                continue
            got += read
            after.append(rest)
        if error is not None and not got:
            if isinstance(error, StoreError) and _redirection(error) is not None:
                self._stale = True
                return [], []
            raise error
        return got, after

    def _block_one(
        self,
        addr: str,
        part: list[str],
        command: Callable[[list[str], int | None], list[Sequence[Any]]],
        block_ms: int,
        state: _Blocked,
    ) -> tuple[Read, tuple[list[str], list[Any]]]:
        if state.stopped:
            return [], (part, [])
        node = self._client(addr)
        pool = node.client.connection_pool
        batch = command(part, block_ms)
        with translate_errors("reading " + ", ".join(part)):
            conn = pool.get_connection()
            try:
                conn.send_packed_command(conn.pack_commands([("CLIENT", "ID"), *batch]))
                state.blocked(self, addr, int(conn.read_response()))
                replies: list[Any] = []
                for _ in batch:
                    try:
                        replies.append(conn.read_response())
                    except redis.ResponseError as exc:
                        replies.append(exc)
            except BaseException:
                conn.disconnect()
                raise
            finally:
                pool.release(conn)
        read = replies[0]
        if isinstance(read, redis.ResponseError):
            raise refusal(read) from read
        entries = read_reply(read)
        if entries:
            state.stop(self)
        return entries, (part, replies[1:])

    # --- consumer groups ------------------------------------------------------------------

    def group_create(self, stream: str, group: str, start: str) -> None:
        self._route(stream, lambda n: n.group_create(stream, group, start))

    def group_setid(self, stream: str, group: str, start: str) -> None:
        self._route(stream, lambda n: n.group_setid(stream, group, start))

    def group_state(self, stream: str, group: str) -> GroupState | None:
        return self._route(stream, lambda n: n.group_state(stream, group))

    def xautoclaim(
        self, stream: str, group: str, consumer: str, *, min_idle_ms: int, start: str, count: int
    ) -> tuple[str, list[tuple[str, Fields | None]]]:
        return self._route(
            stream,
            lambda n: n.xautoclaim(stream, group, consumer, min_idle_ms=min_idle_ms, start=start, count=count),
        )

    def xack(self, stream: str, group: str, ids: Sequence[str]) -> int:
        return self._route(stream, lambda n: n.xack(stream, group, ids))

    # --- scripts --------------------------------------------------------------------------

    def script(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        if not keys:
            raise StoreError(f"script {name} names no key: on a cluster, a script runs where its keys live")
        return self._run_script(keys[0], name, keys, args)

    def _run_script(self, key: str, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        return self.on_master(key, args, lambda node, node_args: node.script(name, keys, node_args), f"script {name}")

    def on_master(
        self, key: str, args: Sequence[Any], call: Callable[[RedisBackend, Sequence[Any]], T], what: str = "a call"
    ) -> T:
        """``call(node, args)`` on the master serving ``key`` (a script and what must follow it
        on the same connection, as ``WAIT``: store/wait.py), with a cluster server id in
        ``args`` replaced by that master's identity; redirections followed (a node that
        redirects ran nothing), a node's ``SLUICE_RESTARTED`` naming the cluster's server id."""
        slot = self._slot(key)
        target: str | None = None
        ask = False
        for _ in range(REDIRECTS):
            addr = target or self._owner(slot)
            node = self._client(addr)
            try:
                if ask:
                    with asking():
                        return call(node, self._for_node(addr, args))
                return call(node, self._for_node(addr, args))
            except RedisUnavailable:
                self._stale = True
                raise
            except ScriptFailed as exc:
                if _redirection(exc) is None:
                    raise self._restarted(exc) from exc.__cause__
                target, ask = self._follow(exc, slot)
        raise RedisUnavailable(f"the Redis Cluster {redact(self.url)} kept redirecting {what} on {key}")

    def script_many(self, calls: Sequence[ScriptCall]) -> list[Any]:
        if not calls:
            return []
        out: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        for _ in range(REDIRECTS):
            again: list[int] = []
            groups: dict[str, list[int]] = {}
            for i in todo:
                keys = calls[i][1]
                if not keys:
                    out[i] = ScriptFailed(f"script {calls[i][0]} names no key: on a cluster it cannot be routed")
                    continue
                groups.setdefault(self.node_of(keys[0]), []).append(i)
            for addr, ix in groups.items():
                sent = [(calls[i][0], calls[i][1], self._for_node(addr, calls[i][2])) for i in ix]
                try:
                    replies = self._client(addr).script_many(sent)
                except RedisUnavailable:
                    self._stale = True
                    raise
                for i, reply in zip(ix, replies):
                    if isinstance(reply, ScriptFailed) and _redirection(reply) is not None:
                        self._follow(reply, self._slot(calls[i][1][0]))
                        again.append(i)
                    elif isinstance(reply, ScriptFailed):
                        out[i] = self._restarted(reply)
                    else:
                        out[i] = reply
            todo = again
            if not todo:
                return out
        raise RedisUnavailable(f"the Redis Cluster {redact(self.url)} kept redirecting {len(todo)} script call(s)")


def _bound(call: Callable[[RedisBackend, list[str]], T], part: list[str]) -> Callable[[RedisBackend], T]:
    return lambda node: call(node, part)


class _Blocked:
    """The blocked reads of one ``_block``: their connections' client ids, and whether one
    has returned (then each is unblocked, by whoever learns of it last)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: list[tuple[str, int]] = []
        self.stopped = False

    def blocked(self, backend: ClusterBackend, addr: str, client_id: int) -> None:
        with self._lock:
            self._ids.append((addr, client_id))
            late = self.stopped
        if late:
            _unblock(backend, [(addr, client_id)])

    def stop(self, backend: ClusterBackend) -> None:
        with self._lock:
            if self.stopped:
                return
            self.stopped = True
            ids = list(self._ids)
        _unblock(backend, ids)


def _unblock(backend: ClusterBackend, ids: list[tuple[str, int]]) -> None:
    by_node: dict[str, list[int]] = {}
    for addr, client_id in ids:
        by_node.setdefault(addr, []).append(client_id)
    for addr, client_ids in by_node.items():
        try:
            backend.node(addr)._raw("unblocking reads", [("CLIENT", "UNBLOCK", i) for i in client_ids], check=False)
        except RedisUnavailable:
            pass  # (that node's reads end with its connections)


def open_backend(url: str, *, check: bool = True, timeout: float = 5.0) -> Backend:
    """The backend for a Redis URL: a :class:`ClusterBackend` for ``redis+cluster://`` and
    ``rediss+cluster://``, else a :class:`RedisBackend` on ``connect(url)``."""
    from .connection import connect, is_cluster_url

    if is_cluster_url(url):
        return ClusterBackend(url, timeout=timeout, check=check)
    return RedisBackend(connect(url, check=check, timeout=timeout))
