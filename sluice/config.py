"""Settings, read from the command line or the environment (``SLUICE_*``), never from the repo."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from sluice.errors import ConfigError

__all__ = [
    "Settings",
    "env_int",
    "env_count",
    "appendfsync",
    "spark_log_level",
    "host_setting",
    "advertised_host",
    "spark_connect_host",
]

FSYNC_POLICIES = ("everysec", "always")
SPARK_LOG_LEVELS = ("OFF", "FATAL", "ERROR", "WARN", "INFO", "DEBUG", "TRACE", "ALL")


def appendfsync(raw: str | None = None) -> str:
    """The embedded Redis's AOF fsync policy: ``everysec`` (the default: a crash of Redis may
    lose its last second of acknowledged writes, which the cluster detects and pays for by
    running unfinished tasks again) or ``always`` (nothing acknowledged is ever lost, at the
    price of an fsync per write). From ``$SLUICE_REDIS_APPENDFSYNC`` unless given."""
    value = (raw if raw is not None else os.environ.get("SLUICE_REDIS_APPENDFSYNC") or "everysec").strip().lower()
    if value not in FSYNC_POLICIES:
        raise ConfigError(
            f"appendfsync {value!r} is not one Sluice supports: use 'everysec' or 'always' "
            "($SLUICE_REDIS_APPENDFSYNC or --appendfsync)"
        )
    return value


def spark_log_level(raw: str | None = None) -> str:
    """The level the Spark (Connect) servers Sluice starts log at: ``WARN`` by default (at
    INFO a job writes tens of thousands of lines), raised with ``$SLUICE_SPARK_LOG_LEVEL``
    (e.g. ``INFO`` or ``DEBUG`` to see what Spark does)."""
    value = (raw if raw is not None else os.environ.get("SLUICE_SPARK_LOG_LEVEL") or "WARN").strip().upper()
    if value not in SPARK_LOG_LEVELS:
        raise ConfigError(
            f"Spark log level {value!r} is not a log4j level: use one of {', '.join(SPARK_LOG_LEVELS)} "
            "($SLUICE_SPARK_LOG_LEVEL)"
        )
    return value


def host_setting(value: str, setting: str) -> str:
    """``value`` as a host name or address to bind to or advertise (stripped); ConfigError,
    naming ``setting``, when it is empty or has spaces in it."""
    host = value.strip()
    if not host or any(c.isspace() for c in host) or "/" in host:
        raise ConfigError(
            f"{setting}={value!r} is not a host name or address: give one such as 127.0.0.1, "
            "198.18.0.2 or node1.example.com"
        )
    return host


def advertised_host(value: str | None, setting: str) -> str | None:
    """A host name or address other hosts reach this process on (None: not given); not a
    wildcard, which names no host."""
    if value is None:
        return None
    host = host_setting(value, setting)
    if host in ("0.0.0.0", "::", "*"):
        raise ConfigError(
            f"{setting}={value!r} is where a server listens, not an address other hosts can reach: "
            "give this machine's name or its address on the network the other hosts share"
        )
    return host


def spark_connect_host(raw: str | None = None) -> str:
    """The address the Spark Connect servers Sluice starts listen on: ``127.0.0.1`` by
    default (only this machine's processes reach them), another address of this machine, or
    ``0.0.0.0`` for every interface, with ``$SLUICE_SPARK_CONNECT_HOST``, so that
    TaskManagers on other hosts can share one server (plain gRPC, no authentication: only on
    a network you trust)."""
    if raw is not None:
        return host_setting(raw, "the Spark Connect host")
    value = os.environ.get("SLUICE_SPARK_CONNECT_HOST")
    return "127.0.0.1" if value is None else host_setting(value, "$SLUICE_SPARK_CONNECT_HOST")


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"${name}={raw!r} is not an integer") from None
    if value <= 0:
        raise ConfigError(f"${name}={raw!r} must be positive")
    return value


def env_count(name: str, default: int) -> int:
    """A whole number of 0 or more from ``$name`` (``default`` when unset)."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"${name}={raw!r} is not a whole number") from None
    if value < 0:
        raise ConfigError(f"${name}={raw!r} must be 0 or more")
    return value


@dataclass(frozen=True)
class Settings:
    """What every Sluice process needs to know. ``redis_url`` None means the embedded Redis."""

    redis_url: str | None = field(default_factory=lambda: os.environ.get("SLUICE_REDIS_URL") or None)
    rq_redis_url: str | None = field(default_factory=lambda: os.environ.get("SLUICE_RQ_REDIS_URL") or None)
    """The single Redis of RQ's slot queues (None: the log's; required when the log is on a Redis Cluster)."""
    prefix: str = field(default_factory=lambda: os.environ.get("SLUICE_PREFIX", "sluice"))
    home: Path = field(default_factory=lambda: Path(os.environ.get("SLUICE_HOME", ".sluice")))
    heartbeat_interval_ms: int = field(default_factory=lambda: env_int("SLUICE_HEARTBEAT_INTERVAL_MS", 1000))
    heartbeat_timeout_ms: int = field(default_factory=lambda: env_int("SLUICE_HEARTBEAT_TIMEOUT_MS", 5000))
    lease_ttl_ms: int = field(default_factory=lambda: env_int("SLUICE_LEASE_TTL_MS", 3000))
    redis_wait_replicas: int = field(default_factory=lambda: env_count("SLUICE_REDIS_WAIT_REPLICAS", 0))
    """Replicas a commit must reach before it is acknowledged (WAIT; store/wait.py): 0, none."""
    redis_wait_timeout_ms: int = field(default_factory=lambda: env_int("SLUICE_REDIS_WAIT_TIMEOUT_MS", 1000))

    def __post_init__(self) -> None:
        if self.heartbeat_timeout_ms <= self.heartbeat_interval_ms:
            raise ConfigError(
                f"heartbeat timeout ({self.heartbeat_timeout_ms} ms) must be longer than the heartbeat "
                f"interval ({self.heartbeat_interval_ms} ms); a few intervals is usual"
            )
