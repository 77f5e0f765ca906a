"""What a Redis ACL user needs to run Sluice, and a check of it when a process starts.

A cluster's keys (its log, tables, job code, and RQ's queues: ``store/keys.py``) all start
with ``{<prefix>:``, and so do RQ's pub/sub channels, so one key pattern and one channel
pattern cover a cluster, and keep two clusters that share a Redis apart:

    ACL SETUSER sluice on >PASSWORD ~{sluice:* &{sluice:* -@all +@read +@write +@scripting
        +@transaction +@connection +@pubsub -@dangerous +info +time

The commands: streams, hashes, lists, sets and sorted sets (read, write), the fenced Lua
scripts (EVALSHA, SCRIPT LOAD), MULTI/EXEC, the connection's own (PING, CLIENT INFO,
SELECT), RQ's worker commands (SUBSCRIBE, PUBLISH), INFO (the server's run id, by which a
restart is detected; RQ reads its version) and TIME (the leader's clock). Without
``+config|get`` Sluice assumes the server may lose its last second of writes at a restart
(``appendfsync everysec``), which is safe; CONFIG GET also shows secrets, so it is left out.

``check_access`` probes one of each at the start, with commands that change nothing, and
raises RedisPermissionDenied naming what is missing and the line that grants it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import redis

from sluice.errors import RedisPermissionDenied

from .connection import redact
from .keys import Keys
from .redis_backend import translate_errors

__all__ = ["COMMANDS", "acl_rules", "acl_setuser", "check_access", "check_log_access", "denied"]

COMMANDS = (
    "-@all",
    "+@read",
    "+@write",
    "+@scripting",
    "+@transaction",
    "+@connection",
    "+@pubsub",
    "-@dangerous",
    "+info",
    "+time",
)
"""The command rules of a Sluice user, in order (a later rule wins over an earlier one)."""

_NO_SCRIPT = "0" * 40
"""The SHA-1 of no script: EVALSHA of it is refused (NOSCRIPT) when it is allowed at all."""


def acl_rules(keys: Keys) -> str:
    """The ACL rules a user needs for the cluster under ``keys.prefix``: its keys, its
    channels and the commands Sluice and RQ run."""
    return f"~{keys.pattern} &{keys.pattern} " + " ".join(COMMANDS)


def acl_setuser(user: str, keys: Keys, password: str = "PASSWORD") -> str:
    """The command that creates (or completes) a Sluice user, as the README shows it."""
    return f"ACL SETUSER {user} on >{password} {acl_rules(keys)}"


@dataclass(frozen=True)
class _Probe:
    doing: str
    """What the user may not do when the probe is refused."""
    command: Sequence[str]


def _probes(keys: Keys, *, log: bool, rq: bool) -> list[_Probe]:
    log_key, rq_key, channel = keys.access_probes()
    out: list[_Probe] = []
    if log:
        out += [
            _Probe(f"read the cluster's keys (EXISTS {log_key})", ["EXISTS", log_key]),
            _Probe(f"write the cluster's keys (XADD {log_key})", ["XADD", log_key, "NOMKSTREAM", "*", "f", "v"]),
            _Probe("run the log's Lua scripts (EVALSHA)", ["EVALSHA", _NO_SCRIPT, "1", log_key]),
            _Probe("load the log's Lua scripts (SCRIPT EXISTS, SCRIPT LOAD)", ["SCRIPT", "EXISTS", _NO_SCRIPT]),
            _Probe("read the server's run id (INFO server)", ["INFO", "server"]),
            _Probe("read the server's clock (TIME)", ["TIME"]),
            _Probe("use transactions (MULTI, EXEC, WATCH, UNWATCH)", ["UNWATCH"]),
        ]
    if rq:
        out += [
            _Probe(f"write RQ's keys (LPUSHX {rq_key})", ["LPUSHX", rq_key, "x"]),
            _Probe(f"publish on RQ's channels (PUBLISH {channel})", ["PUBLISH", channel, "probe"]),
            _Probe("read its connection's details (CLIENT INFO, used by RQ)", ["CLIENT", "INFO"]),
        ]
    return out


def denied(exc: redis.ResponseError, doing: str, url: str, keys: Keys) -> RedisPermissionDenied:
    """The error for a NOPERM reply met while ``doing``: the user, what it may not do, and
    the ACL line that grants what Sluice needs."""
    user = urlsplit(url).username or "default"
    return RedisPermissionDenied(
        f"Redis user {user!r} at {redact(url)} may not {doing}: Redis answered {exc}. "
        f"A Sluice cluster with prefix {keys.prefix!r} needs its keys and channels ({keys.pattern}) "
        f"and these commands; grant them with: ACL SETUSER {user} {acl_rules(keys)}"
    )


def check_access(client: Any, keys: Keys, url: str, *, log: bool = True, rq: bool = True) -> None:
    """Probe, in one round trip and changing nothing, whether the connection's user may do
    what Sluice needs on the cluster under ``keys`` (``log``: the log's keys and commands,
    ``rq``: RQ's, when its queues are on this Redis); RedisPermissionDenied naming the first
    thing it may not do."""
    probes = _probes(keys, log=log, rq=rq)
    with translate_errors("checking what the Redis user may do"):
        pipe = client.pipeline(transaction=False)
        for probe in probes:
            pipe.execute_command(*probe.command)
        replies = pipe.execute(raise_on_error=False)
    for probe, reply in zip(probes, replies):
        if isinstance(reply, redis.exceptions.NoPermissionError):
            raise denied(reply, probe.doing, url, keys)


def check_log_access(backend: object, keys: Keys, url: str, *, rq: bool = True) -> None:
    """``check_access`` on a log's backend when it is one Redis. On a Redis Cluster the probe
    (whose keys hash to several slots) is not sent: a refused command is named when it happens."""
    from .redis_backend import RedisBackend

    if isinstance(backend, RedisBackend):
        check_access(backend.client, keys, url, rq=rq)
