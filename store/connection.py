"""Opening Redis connections: URLs with TLS (``rediss://``) and ACL users, secrets from the environment."""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from sluice.errors import ConfigError, RedisUnavailable

__all__ = ["connect", "redact", "ping", "shutdown", "PASSWORD_ENV"]

PASSWORD_ENV = "SLUICE_REDIS_PASSWORD"
"""If set, the password for the Redis URL's user, so it need not be written in the URL."""


def redact(url: str) -> str:
    """The URL with its password replaced by ``***``, fit for logs and error messages."""
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
    if scheme not in ("redis", "rediss", "unix"):
        raise ConfigError(f"Redis URL {redact(url)!r} must start with redis://, rediss:// (TLS) or unix://")
    # No automatic retries: a commit re-sent after a lost reply could append twice. Callers
    # see RedisUnavailable and recover by re-reading the log, which is always safe.
    kwargs: dict[str, object] = {
        "socket_connect_timeout": timeout,
        "health_check_interval": 30,
        "retry": Retry(NoBackoff(), 0),
    }
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
                f"Redis at {redact(url)} refused our credentials ({exc}); check the URL's user and "
                f"${PASSWORD_ENV}",
                url=redact(url),
            ) from exc
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            raise RedisUnavailable(
                f"cannot reach Redis at {redact(url)}: {exc}; is the server running?", url=redact(url)
            ) from exc
    return client


def _quick(url: str, timeout: float) -> redis.Redis:
    return redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout, retry=Retry(NoBackoff(), 0))


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
