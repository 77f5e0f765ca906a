"""Commits acknowledged only once replicas have them: Redis's ``WAIT`` after a commit.

Replication is asynchronous: a master acknowledges a commit before its replicas have it, and
a failover (its replica promoted) loses what the replica had not yet received, up to the last
second or so (store/shards.py: the cluster sees it as a restart of that shard's log and runs
unfinished work again). A user who needs no acknowledged commit lost asks for
``SLUICE_REDIS_WAIT_REPLICAS=N``: each commit is followed, on the same connection (``WAIT``
counts the replicas that have that connection's writes, and cannot run inside a script),
by ``WAIT N timeout``; a commit that fewer replicas have within the timeout raises
:class:`~sluice.errors.RedisUnavailable`, as a commit whose reply was lost does: its writer
does not know whether it will survive a failover, and acts as on any unknown outcome (a
leader steps down and rebuilds from the log).

Only commits wait (the facts and the messages a decision causes); the other writes (heartbeats,
reads' bookkeeping, leases) may still be lost by a failover, which is still announced as a
restart (``Backend.durable`` stays what it was): WAIT makes a failover lose no acknowledged
fact, not cost nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from sluice.errors import ConfigError, RedisUnavailable, StoreError

from .backend import Backend, Delegating, ScriptFailed

__all__ = ["Wait", "script_then_wait"]


@dataclass(frozen=True, slots=True)
class Wait:
    """How many replicas must have a commit before it is acknowledged, and how long to wait."""

    replicas: int = 0
    timeout_ms: int = 1000

    def __post_init__(self) -> None:
        if self.replicas < 0:
            raise ConfigError(
                f"SLUICE_REDIS_WAIT_REPLICAS={self.replicas}: give how many replicas must have a commit "
                "before it is acknowledged (0: none, the default)"
            )
        if self.timeout_ms < 1:
            raise ConfigError(
                f"SLUICE_REDIS_WAIT_TIMEOUT_MS={self.timeout_ms}: give how long (ms, 1 or more) a commit "
                "waits for its replicas"
            )

    @property
    def on(self) -> bool:
        return self.replicas > 0


def script_then_wait(backend: Backend, name: str, keys: Sequence[str], args: Sequence[Any], wait: Wait) -> Any:
    """Run script ``name`` and then ``WAIT`` on the connection it ran on; the script's reply.
    A script error reply raises ScriptFailed (nothing was written: no wait); fewer replicas
    than asked within the timeout raise RedisUnavailable."""
    from .cluster_backend import ClusterBackend
    from .memory import MemoryBackend
    from .redis_backend import RedisBackend

    inner = backend
    while isinstance(inner, Delegating):
        inner = inner.inner
    if isinstance(inner, ClusterBackend):  # on the master that serves the tag
        reply, acks = _cluster(inner, name, keys, args, wait)
    elif isinstance(inner, RedisBackend):
        reply, acks = _redis(inner, name, keys, args, wait)
    elif isinstance(inner, MemoryBackend):  # the in-memory store keeps no replicas: every write is on all of them
        return backend.script(name, keys, args)
    else:
        raise ConfigError(
            f"SLUICE_REDIS_WAIT_REPLICAS is set, but {backend.describe()} cannot wait for replicas: "
            "unset it, or use Redis (one server or a cluster)"
        )
    if int(acks) < wait.replicas:
        raise RedisUnavailable(
            f"a commit to {keys[0] if keys else '?'} reached {acks} of the {wait.replicas} replicas asked for "
            f"within {wait.timeout_ms} ms (SLUICE_REDIS_WAIT_REPLICAS): it may be lost if its master fails over; "
            "check that the replicas are up and in sync (INFO replication), or lower the setting"
        )
    return reply


def _cluster(backend: Any, name: str, keys: Sequence[str], args: Sequence[Any], wait: Wait) -> tuple[Any, int]:
    """The script and WAIT on the master serving ``keys[0]`` (``ClusterBackend.on_master``:
    redirections followed as for any script; a node that redirects ran nothing)."""
    if not keys:
        raise StoreError(f"script {name} names no key: on a cluster, a script runs where its keys live")
    return cast(
        "tuple[Any, int]",
        backend.on_master(
            keys[0], args, lambda node, node_args: _redis(node, name, keys, node_args, wait), f"script {name}"
        ),
    )


def _redis(backend: Any, name: str, keys: Sequence[str], args: Sequence[Any], wait: Wait) -> tuple[Any, int]:
    import redis

    script = backend._scripts[name]
    what = f"running script {name} on {keys[0] if keys else '?'} and waiting for {wait.replicas} replicas"
    for head in (("EVALSHA", script.sha), ("EVAL", script.script)):
        reply, acks = backend._raw(
            what, [(*head, len(keys), *keys, *args), ("WAIT", wait.replicas, wait.timeout_ms)], check=False
        )
        if not isinstance(reply, redis.exceptions.NoScriptError):
            break
    if isinstance(reply, redis.ResponseError):
        raise ScriptFailed(str(reply)) from reply
    if isinstance(acks, redis.ResponseError):
        raise RedisUnavailable(f"WAIT after a commit to {keys[0] if keys else '?'} failed: {acks}") from acks
    return reply, int(acks)
