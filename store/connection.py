"""Opening Redis connections: URLs with TLS (``rediss://``) and ACL users, secrets from the environment."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from sluice.errors import ConfigError, RedisPermissionDenied, RedisUnavailable

__all__ = [
    "connect",
    "redact",
    "ping",
    "shutdown",
    "Outage",
    "SOCKET_TIMEOUT_S",
    "keepalive_options",
    "PASSWORD_ENV",
    "ClusterURL",
    "CLUSTER_SCHEMES",
    "is_cluster_url",
    "parse_cluster_url",
    "rq_url",
    "RQ_URL_ENV",
]

T = TypeVar("T")

PASSWORD_ENV = "SLUICE_REDIS_PASSWORD"
"""If set, the password for the Redis URL's user, so it need not be written in the URL."""

SOCKET_TIMEOUT_S = 30.0
"""How long a client waits for any reply before it counts its connection as broken. Above
the longest blocking call made on a client of ``connect``: a slot worker's BLMOVE waits
``store.slots.DEQUEUE_TIMEOUT_S`` (10 s; RQ raises the timeout to 10 s above that if it is
lower), a reader's XREAD BLOCK a second at most."""

KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES = 5, 2, 3
"""TCP keepalive of every connection: the first probe after 5 s of silence, then every 2 s,
and the connection is broken after 3 unanswered ones (about 11 s; only the peer's kernel
answers them, so a server busy for longer, say forking, does not break it). A peer that went away
without closing (a container disconnected from its network and connected again at a new
address) is then noticed while a call waits, and the next call opens a new connection.
Where the platform has it (Linux), ``TCP_USER_TIMEOUT`` breaks it as soon when what it sent
is not acknowledged for as long (keepalive probes only go while nothing is unacknowledged:
a command sent into the void would otherwise be retransmitted for about 15 minutes)."""


def keepalive_options() -> dict[int, int]:
    """The ``socket_keepalive_options`` of a TCP connection (the constants this platform has:
    Linux all three; macOS names the idle time ``TCP_KEEPALIVE``)."""
    wanted = (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE_S),
        ("TCP_KEEPALIVE", KEEPALIVE_IDLE_S),
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
        ("TCP_KEEPCNT", KEEPALIVE_PROBES),
    )
    options: dict[int, int] = {}
    for name, value in wanted:
        option = getattr(socket, name, None)
        if option is not None and not (name == "TCP_KEEPALIVE" and hasattr(socket, "TCP_KEEPIDLE")):
            options[option] = value
    user_timeout = getattr(socket, "TCP_USER_TIMEOUT", None)
    if user_timeout is not None:  # milliseconds
        options[user_timeout] = 1000 * (KEEPALIVE_IDLE_S + KEEPALIVE_INTERVAL_S * KEEPALIVE_PROBES)
    return options


def redact(url: str) -> str:
    """The URL with its password replaced by ``***``, fit for logs and error messages."""
    if is_cluster_url(url):
        return _redact_cluster(url)
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    netloc = f"{user}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def connect(url: str, *, check: bool = True, timeout: float = 5.0) -> redis.Redis:
    """A client for ``url`` (``redis://``, ``rediss://`` or ``unix://``), answering bytes.

    The password may come from ``$SLUICE_REDIS_PASSWORD`` instead of the URL. With
    ``check`` the server is pinged, and an unreachable one raises RedisUnavailable.
    """
    scheme = urlsplit(url).scheme
    if scheme in CLUSTER_SCHEMES:
        raise ConfigError(
            f"{redact(url)!r} is a Redis Cluster: open it with store.open_backend (the log), not as one "
            "Redis; RQ's queues need a single Redis ($SLUICE_RQ_REDIS_URL)"
        )
    if scheme not in ("redis", "rediss", "unix"):
        raise ConfigError(f"Redis URL {redact(url)!r} must start with redis://, rediss:// (TLS) or unix://")
    # No automatic retries: a commit re-sent after a lost reply could append twice. Callers
    # see RedisUnavailable and recover by re-reading the log, which is always safe.
    # A reply that does not come within SOCKET_TIMEOUT_S, or a peer that stops answering
    # TCP keepalive probes, breaks the connection (TimeoutError, ConnectionError: callers see
    # RedisUnavailable) instead of leaving a call waiting for good on a dead socket.
    kwargs: dict[str, object] = {
        "socket_connect_timeout": timeout,
        "socket_timeout": max(SOCKET_TIMEOUT_S, timeout),
        "health_check_interval": 30,
        "retry": Retry(NoBackoff(), 0),
    }
    if scheme != "unix":
        kwargs.update(socket_keepalive=True, socket_keepalive_options=keepalive_options())
    password = os.environ.get(PASSWORD_ENV)
    if password and urlsplit(url).password is None:
        kwargs["password"] = password
    try:
        client = redis.Redis.from_url(url, **kwargs)
    except ValueError as exc:
        raise ConfigError(f"Redis URL {redact(url)!r} is not valid: {exc}") from exc
    if check:
        try:
            client.ping()
        except redis.AuthenticationError as exc:
            raise RedisUnavailable(
                f"Redis at {redact(url)} refused our credentials ({exc}); check the URL's user and ${PASSWORD_ENV}",
                url=redact(url),
            ) from exc
        except redis.exceptions.NoPermissionError as exc:
            raise RedisPermissionDenied(
                f"Redis user {urlsplit(url).username or 'default'!r} at {redact(url)} may not run PING: Redis "
                f"answered {exc}; give it the commands Sluice needs (README: Security)"
            ) from exc
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            raise RedisUnavailable(
                f"cannot reach Redis at {redact(url)}: {exc}; {_hint(scheme, str(exc))}", url=redact(url)
            ) from exc
    return client


def _hint(scheme: str, error: str) -> str:
    """What to check when a connection failed: the server, or (TLS) its certificate or port."""
    if "CERTIFICATE_VERIFY_FAILED" in error or "certificate" in error.lower():
        return (
            "the server's TLS certificate was not accepted: give the CA that signed it in the URL "
            "(rediss://USER@HOST:PORT/0?ssl_ca_certs=/path/to/ca.crt) and connect to a host name or "
            "address the certificate names"
        )
    if scheme == "rediss" and any(word in error for word in ("SSL", "EOF", "reset", "Timeout")):
        return "the TLS handshake did not complete: is the server running, and is that port its --tls-port?"
    if scheme == "redis" and "reset" in error:
        return "is the server running? (a server that serves TLS on that port needs rediss://)"
    return "is the server running?"


def _quick(url: str, timeout: float) -> redis.Redis:
    return redis.Redis.from_url(
        url, socket_connect_timeout=timeout, socket_timeout=timeout, retry=Retry(NoBackoff(), 0)
    )


def ping(url: str, *, timeout: float = 0.5) -> bool:
    """Whether a Redis answers at ``url`` and is ready (not loading its data)."""
    try:
        return bool(_quick(url, timeout).ping())
    except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError, OSError):
        return False


def shutdown(url: str) -> None:
    """Ask the server to shut down (flushing its AOF); quiet if it is already gone."""
    try:
        _quick(url, 2.0).shutdown(nosave=True)
    except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError, OSError):
        pass


class Outage:
    """Riding out a time when Redis does not answer.

    ``wait()`` blocks until ``probe`` succeeds, trying again with a growing delay (at most
    ``max_delay_s``), and says so on stderr once when Redis goes away and once when it is
    back, never once per try. ``give_up`` is asked at every try for a reason to stop
    waiting (say, the process that owns this one is gone); with one, or after ``limit_s``,
    ``wait()`` raises RedisUnavailable with that reason. The caller then does again what
    failed: an outage costs time, not the work done so far.
    """

    def __init__(
        self,
        probe: Callable[[], object],
        *,
        who: str,
        url: str,
        give_up: Callable[[], str | None] = lambda: None,
        limit_s: float | None = None,
        max_delay_s: float = 2.0,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.probe, self.who, self.url = probe, who, redact(url)
        self.give_up, self.limit_s, self.max_delay_s = give_up, limit_s, max_delay_s
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.outages = 0
        self.waited_s = 0.0
        """Seconds spent waiting, over every outage (for tests and logs)."""

    def reachable(self) -> bool:
        try:
            self.probe()
            return True
        except (RedisUnavailable, redis.ConnectionError, redis.TimeoutError, OSError):
            return False

    def wait(self, cause: BaseException | None = None) -> float:
        """Block until Redis answers again; returns the seconds waited (0.0: it answered at once)."""
        if self.reachable():
            return 0.0
        began = time.monotonic()
        self.outages += 1
        why = f" ({cause})" if cause is not None else ""
        self.say(f"{self.who}: Redis at {self.url} is away{why}; waiting for it to come back")
        delay = 0.05
        while True:
            reason = self.give_up()
            waited = time.monotonic() - began
            if reason is None and self.limit_s is not None and waited > self.limit_s:
                reason = f"it has been away for more than {self.limit_s:.0f} s"
            if reason is not None:
                self.say(f"{self.who}: gave up waiting for Redis at {self.url} after {waited:.1f} s: {reason}")
                raise RedisUnavailable(
                    f"{self.who} gave up waiting for Redis at {self.url} after {waited:.1f} s: {reason}", url=self.url
                )
            time.sleep(delay)
            delay = min(delay * 2, self.max_delay_s)
            if self.reachable():
                waited = time.monotonic() - began
                self.waited_s += waited
                self.say(f"{self.who}: Redis at {self.url} is back after {waited:.1f} s")
                return waited

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()``, done again after every outage until it gets through (so ``fn`` must be
        safe to repeat: a write whose reply was lost may have landed)."""
        while True:
            try:
                return fn()
            except (RedisUnavailable, redis.ConnectionError, redis.TimeoutError) as exc:
                self.wait(exc)


# --- Redis Cluster URLs -------------------------------------------------------------------

CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
"""A log on a Redis Cluster: ``redis+cluster://[user[:password]@]host:port,host:port,...``
(seed nodes; any one that answers tells where the others are), ``rediss+cluster://`` with
TLS."""


@dataclass(frozen=True)
class ClusterURL:
    seeds: tuple[str, ...]
    """``host:port`` of each seed node, as given."""
    tls: bool
    username: str | None
    password: str | None


def is_cluster_url(url: str) -> bool:
    return url.partition("://")[0].lower() in CLUSTER_SCHEMES


RQ_URL_ENV = "SLUICE_RQ_REDIS_URL"
"""The single-node Redis of RQ's slot queues, when it is not the log's (a log on a cluster)."""


def rq_url(log_url: str, rq: str | None) -> str:
    """The URL of the Redis that holds RQ's slot queues: ``rq``, or the log's when none is
    given. RQ is not cluster-safe (its scripts and transactions span keys of many slots;
    rq/rq#1942), so a log on a Redis Cluster needs ``rq`` (ConfigError saying so)."""
    if rq:
        if is_cluster_url(rq):
            raise ConfigError(
                f"${RQ_URL_ENV}={redact(rq)!r} is a Redis Cluster: RQ's queues need a single Redis "
                "(RQ is not cluster-safe); give a redis://, rediss:// or unix:// URL"
            )
        return rq
    if is_cluster_url(log_url):
        raise ConfigError(
            f"the log is on a Redis Cluster ({redact(log_url)}), and RQ's slot queues cannot be: RQ is not "
            f"cluster-safe (rq/rq#1942). Set ${RQ_URL_ENV} (or --rq-redis) to a single-node Redis for them, "
            "e.g. redis://queues-host:6379/0"
        )
    return log_url


def _redact_cluster(url: str) -> str:
    scheme, _, rest = url.partition("://")
    netloc, sep, tail = _split_tail(rest)
    user, at, hosts = netloc.rpartition("@")
    if not at or ":" not in user:
        return url
    return f"{scheme}://{user.split(':', 1)[0]}:***@{hosts}{sep}{tail}"


def _split_tail(rest: str) -> tuple[str, str, str]:
    """(the part before the first '/' or '?', that character, what follows)."""
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=-1)
    return (rest, "", "") if cut < 0 else (rest[:cut], rest[cut], rest[cut + 1 :])


def parse_cluster_url(url: str) -> ClusterURL:
    """The seeds and credentials of a ``redis+cluster://`` URL (ConfigError naming what is wrong)."""
    from urllib.parse import unquote

    shown = redact(url)
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in CLUSTER_SCHEMES:
        raise ConfigError(f"Redis Cluster URL {shown!r} must start with redis+cluster:// or rediss+cluster:// (TLS)")
    netloc, mark, tail = _split_tail(rest)
    if mark == "?" or "?" in tail:
        raise ConfigError(f"Redis Cluster URL {shown!r} takes no options after '?': give only user, password and nodes")
    if mark == "/" and tail not in ("", "0"):
        raise ConfigError(
            f"Redis Cluster URL {shown!r} names database {tail!r}: a Redis Cluster has only database 0 "
            "(leave the path out)"
        )
    userinfo, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    seeds: list[str] = []
    for raw in hosts.split(","):
        node = raw.strip()
        if not node:
            raise ConfigError(
                f"Redis Cluster URL {shown!r} has an empty node: list them as host:port,host:port (no spaces or "
                "trailing comma)"
            )
        host, colon, port = node.rpartition(":") if not node.endswith("]") else (node, "", "")
        if not colon:
            host, port = node, "6379"
        host = host.strip("[]")
        if not host:
            raise ConfigError(f"Redis Cluster URL {shown!r}: node {node!r} has no host")
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"Redis Cluster URL {shown!r}: node {node!r} has no valid port (1-65535)")
        seeds.append(f"{host}:{int(port)}")
    return ClusterURL(tuple(dict.fromkeys(seeds)), scheme.lower() == "rediss+cluster", username, password)
