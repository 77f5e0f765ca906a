"""Settings: one typed object (pydantic-settings), read from command-line flags, ``SLUICE_*``
environment variables and an optional TOML file, in that order of precedence (a flag beats a
variable, which beats the file, which beats the default).

Each setting is declared once, as a field of ``Settings``: its type, its default, what it
means, what is allowed, and the flag that sets it (on every command, or on the commands
named). Its variable is ``SLUICE_<NAME>`` and its key in the file is its name. The file is
``--config PATH`` (or ``$SLUICE_CONFIG``), else ``sluice.toml`` in the home folder if there is
one. ``load`` resolves them and says where each value came from (``Resolved.origin``); a bad
value is a ConfigError naming the setting (as flag, variable and file key), the value and
what is allowed, never a pydantic traceback.

A process hands the values it resolved to the code below it and to the processes it starts
through their variables (``export_environ``), so that a value from a flag or the file reaches
a setting read deep in a service as the one from the environment does.
"""

from __future__ import annotations

import contextvars
import functools
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal
from urllib.parse import unquote, urlsplit

from pydantic import Field, JsonValue, SecretStr, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)
from pydantic_settings.sources.utils import parse_env_vars

from sluice.errors import ConfigError
from sluice.store.connection import CLUSTER_SCHEMES, redact

__all__ = [
    "CONFIG_ENV",
    "CONFIG_FILE",
    "Settings",
    "Resolved",
    "Spec",
    "load",
    "resolve",
    "specs",
    "export_environ",
    "restore_environ",
    "check_writable",
    "check_deploy_timeout",
    "spelled",
    "describe",
    "env_int",
    "appendfsync",
    "spark_log_level",
    "host_setting",
    "advertised_host",
    "spark_connect_host",
]

ENV_PREFIX = "SLUICE_"
CONFIG_ENV = "SLUICE_CONFIG"
"""Names the settings file, as ``--config`` does."""
CONFIG_FILE = "sluice.toml"
"""The settings file read from the home folder when no other is named."""

FSYNC_POLICIES = ("everysec", "always")
SPARK_LOG_LEVELS = ("OFF", "FATAL", "ERROR", "WARN", "INFO", "DEBUG", "TRACE", "ALL")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
SPARK_SERVERS = ("shared", "per-taskmanager")
WILDCARDS = ("0.0.0.0", "::", "*")

EVERY_COMMAND: tuple[str, ...] = ()
JM = ("jobmanager",)
TM = ("taskmanager",)


# --- host names, fsync policy, Spark log level: also used on their own ---------------------------


def _host_problem(value: str) -> str | None:
    host = value.strip()
    if not host or any(c.isspace() for c in host) or "/" in host:
        return "is not a host name or address: give one such as 127.0.0.1, 198.18.0.2 or node1.example.com"
    return None


def _advertised_problem(value: str) -> str | None:
    problem = _host_problem(value)
    if problem is None and value.strip() in WILDCARDS:
        return (
            "is where a server listens, not an address other hosts can reach: give this machine's name "
            "or its address on the network the other hosts share"
        )
    return problem


def host_setting(value: str, setting: str) -> str:
    """``value`` as a host name or address to bind to or advertise (stripped); ConfigError,
    naming ``setting``, when it is empty or has spaces in it."""
    problem = _host_problem(value)
    if problem:
        raise ConfigError(f"{setting}={value!r} {problem}")
    return value.strip()


def advertised_host(value: str | None, setting: str) -> str | None:
    """A host name or address other hosts reach this process on (None: not given); not a
    wildcard, which names no host."""
    if value is None:
        return None
    problem = _advertised_problem(value)
    if problem:
        raise ConfigError(f"{setting}={value!r} {problem}")
    return value.strip()


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
    """A positive integer from the variable ``name`` (``default`` when unset or empty)."""
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


# --- the settings ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """What a setting is beyond its type: its names, what it means, what is allowed."""

    name: str
    meaning: str
    allowed: str
    flag: str | None  # "--slot-timeout" (None: no flag, a secret: it would show in `ps`)
    aliases: tuple[str, ...]
    commands: tuple[str, ...]  # () every command; else e.g. ("jobmanager", "cluster up")
    metavar: str
    secret: bool

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def key(self) -> str:
        return self.name

    @property
    def is_bool(self) -> bool:
        return bool(self.flag and "/" in self.flag)


def setting(
    default: Any,
    meaning: str,
    allowed: str,
    flag: str | None,
    *,
    commands: tuple[str, ...] = EVERY_COMMAND,
    aliases: tuple[str, ...] = (),
    metavar: str = "",
    secret: bool = False,
    **constraints: Any,
) -> Any:
    """A field of Settings with what ``Spec`` says of it."""
    extra: dict[str, JsonValue] = {
        "allowed": allowed,
        "flag": flag,
        "aliases": list(aliases),
        "commands": list(commands),
        "metavar": metavar,
        "secret": secret,
    }
    return Field(default, description=meaning, json_schema_extra=extra, **constraints)


_PREFIX_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")  # as store/keys.py's Keys checks it
PREFIX_ALLOWED = "1-64 letters, digits, '_', '.' or '-'"
PositiveInt = Annotated[int, Field(gt=0)]
Port = Annotated[int, Field(ge=0, le=65535)]
POSITIVE_MS = "a whole number of milliseconds above 0"
PORT = "a port number from 0 to 65535 (0: no metrics endpoint)"
_plan: contextvars.ContextVar[tuple[PydanticBaseSettingsSource, ...] | None] = contextvars.ContextVar(
    "sluice_settings_plan", default=None
)


class Settings(BaseSettings):
    """What every Sluice process needs to know. ``redis_url`` None means the embedded Redis."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_ignore_empty=True,
        extra="forbid",
        frozen=True,
        hide_input_in_errors=False,
    )

    # -- every command ---------------------------------------------------------------------------
    redis_url: str | None = setting(
        None,
        "the Redis of the log: `redis://`, `rediss://` (TLS) or `unix://`, the user in the URL, or a Redis "
        "Cluster's `redis+cluster://host:port,host:port`; unset: the embedded Redis in the home",
        "a redis://, rediss:// (TLS), unix://, redis+cluster:// or rediss+cluster:// URL",
        "--redis",
        metavar="URL",
    )
    redis_password: SecretStr | None = setting(
        None,
        "the password of the Redis URL's user (kept out of the URL; never printed)",
        "the password, as text",
        None,
        secret=True,
    )
    rq_redis_url: str | None = setting(
        None,
        "the Redis of RQ's slot queues (a single Redis); unset: the Redis of the log, which must then not be a "
        "Redis Cluster",
        "a redis://, rediss:// (TLS) or unix:// URL",
        "--rq-redis",
        metavar="URL",
    )
    redis_wait_replicas: Annotated[int, Field(ge=0)] = setting(
        0,
        "replicas a commit must reach before it is acknowledged (Redis `WAIT`, on a replicated Redis or a "
        "Redis Cluster's masters); 0: acknowledged when the master has it",
        "a whole number of replicas, 0 or more",
        "--redis-wait-replicas",
        metavar="N",
    )
    redis_wait_timeout_ms: PositiveInt = setting(
        1000,
        "milliseconds a commit waits for those replicas; fewer in time: the commit counts as unanswered",
        POSITIVE_MS,
        "--redis-wait-timeout",
        metavar="MS",
    )
    prefix: str = setting(
        "sluice",
        "prefix of every Redis key (clusters sharing a Redis each have their own)",
        PREFIX_ALLOWED,
        "--prefix",
        metavar="WORD",
    )
    home: Path = setting(
        Path(".sluice"),
        "the data folder: the embedded cluster's Redis, logs, caches and (by default) storage root; its "
        "`sluice.toml` is read when no other file is named",
        "a folder this user can write",
        "--home",
        metavar="DIR",
    )
    heartbeat_interval_ms: PositiveInt = setting(
        1000,
        "heartbeats between the leader and TaskManagers, both ways",
        POSITIVE_MS,
        "--heartbeat-interval",
        metavar="MS",
    )
    heartbeat_timeout_ms: PositiveInt = setting(
        5000,
        "silence after which a TaskManager is lost (or a TaskManager gives up on its leader)",
        POSITIVE_MS + ", longer than the heartbeat interval",
        "--heartbeat-timeout",
        metavar="MS",
    )
    lease_ttl_ms: PositiveInt = setting(
        3000,
        "the leadership lease: a standby takes over this long after the leader dies",
        POSITIVE_MS,
        "--lease-ttl",
        metavar="MS",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = setting(
        "INFO", "level of the processes' log lines (on stderr)", "one of " + ", ".join(LOG_LEVELS), "--log-level"
    )
    log_json: bool = setting(
        False, "log lines as JSON objects instead of text", "true or false (1 or 0)", "--log-json/--no-log-json"
    )
    host: str | None = setting(
        None,
        "this machine's name in process ids, and a TaskManager's host unless advertise_host is given; "
        "unset: the OS's host name",
        "a host name or address",
        "--host-name",
        metavar="HOST",
    )
    spark_master: str = setting(
        "local[*]",
        "master of the Spark Connect servers Sluice starts (and of local Spark sessions)",
        "a Spark master URL (local[*], local[4], spark://HOST:PORT)",
        "--spark-master",
        metavar="MASTER",
    )
    spark_connect_host: str = setting(
        "127.0.0.1",
        "address the Spark Connect servers Sluice starts listen on (`0.0.0.0`: every interface, to share "
        "one with other hosts; plain gRPC, a trusted network only)",
        "a host name or address",
        "--spark-connect-host",
        metavar="ADDRESS",
    )
    spark_log_level: Literal["OFF", "FATAL", "ERROR", "WARN", "INFO", "DEBUG", "TRACE", "ALL"] = setting(
        "WARN",
        "level the Spark servers Sluice starts log at (their log: `<home>/logs/<tm>-spark-connect.log`)",
        "a log4j level: one of " + ", ".join(SPARK_LOG_LEVELS),
        "--spark-log-level",
    )
    spark_cds: str | None = setting(
        None,
        "Spark's class-data archive; unset: `~/.cache/sluice/spark-connect-<pyspark>-<hash>.jsa`",
        "a file path, or `off`",
        "--spark-cds",
        metavar="FILE",
    )
    s3_endpoint: str | None = setting(
        None,
        "S3 endpoint of `s3://` inputs (`http(s)://host:port`: SeaweedFS, MinIO, ...); unset: "
        "$AWS_ENDPOINT_URL, else AWS",
        "an http:// or https:// URL",
        "--s3-endpoint",
        metavar="URL",
    )
    # -- the embedded cluster --------------------------------------------------------------------
    redis_appendfsync: Literal["everysec", "always"] = setting(
        "everysec",
        "the embedded Redis's fsync: `always` loses nothing on a crash of Redis, `everysec` may lose its "
        "last second (paid for by running unfinished tasks again)",
        "everysec or always",
        "--appendfsync",
        commands=("cluster up", "cluster start"),
    )
    spark_servers: Literal["shared", "per-taskmanager"] = setting(
        "shared",
        "one Spark Connect server for the embedded cluster, or one per TaskManager",
        "shared or per-taskmanager",
        "--spark-servers",
        commands=("run", "cluster up", "cluster start"),
    )
    # -- the JobManager --------------------------------------------------------------------------
    storage_root: str | None = setting(
        None,
        "where result partitions go (`file://`, on a file system every host sees); unset: `<home>/storage`",
        "a file:// URI of a folder this user can write",
        "--storage-root",
        commands=JM,
        metavar="URI",
    )
    slot_timeout_s: PositiveInt = setting(
        300,
        "seconds a job may wait for free slots without progress before it fails",
        "a whole number of seconds above 0",
        "--slot-timeout",
        commands=JM,
        metavar="S",
    )
    checkpoint_interval_ms: PositiveInt = setting(
        2000,
        "milliseconds between checkpoints of a coordinator that has new inputs",
        POSITIVE_MS,
        "--checkpoint-interval",
        commands=JM,
        metavar="MS",
    )
    deploy_timeout_s: PositiveInt = setting(
        60,
        "seconds a deployment may go unanswered before the attempt fails and runs again",
        "a whole number of seconds, at least twice the heartbeat timeout",
        "--deploy-timeout",
        commands=JM,
        metavar="S",
    )
    speculation: str = setting(
        "off",
        "speculative execution of slow subtasks: `off`, `on` (slow past 1.5 x its vertex's median, and "
        "at least 60 s), or `X,MS` (on: slow past X x the median and at least MS milliseconds)",
        "off, on, or a multiplier of 1 or more and milliseconds (1.5,60000)",
        "--speculation",
        commands=JM,
        metavar="SPEC",
    )
    snapshot_interval_ms: PositiveInt = setting(
        5000,
        "how often the leader snapshots the tags whose facts grew",
        POSITIVE_MS,
        "--snapshot-interval",
        commands=JM,
        metavar="MS",
    )
    fact_retention: str = setting(
        "keep",
        "archived jobs whose facts the leader keeps: `keep` all, `1000` the last 1,000, `30d` those ended "
        "within 30 days",
        "keep, a number of jobs (1000) or of days (30d)",
        "--fact-retention",
        commands=JM,
        metavar="RETENTION",
    )
    inbox_retention_ms: Annotated[int, Field(ge=0)] = setting(
        600_000,
        "milliseconds of consumed traffic an inbox or delivered outbox keeps for `sluice inspect tail`",
        "a whole number of milliseconds, 0 or more",
        "--inbox-retention",
        commands=("jobmanager", "taskmanager"),
        metavar="MS",
    )
    # -- metrics ---------------------------------------------------------------------------------
    metrics_host: str = setting(
        "0.0.0.0",
        "address the processes' metrics endpoints listen on",
        "a host name or address",
        "--metrics-host",
        commands=("jobmanager", "taskmanager", "projector"),
        metavar="ADDRESS",
    )
    jobmanager_metrics_port: Port = setting(
        0, "the JobManager's Prometheus endpoint (0: off)", PORT, "--metrics-port", commands=JM, metavar="PORT"
    )
    taskmanager_metrics_port: Port = setting(
        0, "a TaskManager's Prometheus endpoint (0: off)", PORT, "--metrics-port", commands=TM, metavar="PORT"
    )
    projector_metrics_port: Port = setting(
        0,
        "the projector's Prometheus endpoint (0: off)",
        PORT,
        "--metrics-port",
        commands=("projector",),
        metavar="PORT",
    )
    # -- a TaskManager ---------------------------------------------------------------------------
    advertise_host: str | None = setting(
        None,
        "the name or address other hosts reach a TaskManager on, carried in its registration; unset: "
        "host, else the OS's host name",
        "a host name or address other hosts can reach (not a wildcard such as 0.0.0.0)",
        "--advertise-host",
        aliases=("--host",),
        commands=TM,
        metavar="HOST",
    )
    spark_remote: str | None = setting(
        None,
        "the Spark Connect server a TaskManager's workers use; unset: the embedded cluster's, or one the "
        "TaskManager starts",
        "an sc://HOST:PORT URL",
        "--spark",
        commands=TM,
        metavar="sc://HOST:PORT",
    )
    io_rate: Annotated[float, Field(ge=0)] = setting(
        0.0,
        "bytes a second a slot reads input splits at (0: no limit)",
        "a number of bytes a second, 0 or more",
        "--io-rate",
        commands=TM,
        metavar="BYTES/S",
    )
    task_partitions: Annotated[int, Field(ge=0)] | None = setting(
        None,
        "Spark partitions every task reads and shuffles into (0: Spark decides); unset: each task's share "
        "of its server's cores",
        "a whole number, 0 or more",
        "--task-partitions",
        commands=TM,
        metavar="N",
    )
    spark_cores: PositiveInt | None = setting(
        None,
        "cores of the Spark server given with --spark, for the tasks' share of them",
        "a whole number above 0",
        "--spark-cores",
        commands=TM,
        metavar="N",
    )
    spark_slots: PositiveInt | None = setting(
        None,
        "slots sharing that server, all TaskManagers together; unset: this TaskManager's",
        "a whole number above 0",
        "--spark-slots",
        commands=TM,
        metavar="N",
    )
    worker_redis_wait_s: Annotated[float, Field(gt=0)] = setting(
        3600.0,
        "seconds a slot's worker waits for Redis in one outage",
        "a number of seconds above 0",
        "--worker-redis-wait",
        commands=TM,
        metavar="S",
    )
    # -- the dashboard ---------------------------------------------------------------------------
    ui_host: str = setting(
        "127.0.0.1",
        "address the dashboard listens on (`0.0.0.0`: every interface; plain HTTP)",
        "a host name or address",
        "--host",
        commands=("ui",),
        metavar="ADDRESS",
    )
    ui_port: Port = setting(
        8087, "port the dashboard listens on (0: any free port)", "a port number from 0 to 65535", "--port",
        commands=("ui",), metavar="PORT",
    )  # fmt: skip
    ui_token: SecretStr | None = setting(
        None,
        "the bearer token that allows cancelling jobs from the dashboard; unset: read-only",
        "the token, as text",
        None,
        secret=True,
    )

    # -- checks ----------------------------------------------------------------------------------

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        if value is not None and urlsplit(value).scheme not in ("redis", "rediss", "unix", *CLUSTER_SCHEMES):
            raise ValueError(
                "is not a Redis URL: give a redis://, rediss:// (TLS) or unix:// URL, or a Redis Cluster's "
                "redis+cluster://host:port,host:port (rediss+cluster:// for TLS)"
            )
        return value

    @field_validator("rq_redis_url")
    @classmethod
    def _rq_redis_url(cls, value: str | None) -> str | None:
        if value is not None and urlsplit(value).scheme in CLUSTER_SCHEMES:
            raise ValueError("is a Redis Cluster: RQ's queues need a single Redis (RQ is not cluster-safe; rq/rq#1942)")
        if value is not None and urlsplit(value).scheme not in ("redis", "rediss", "unix"):
            raise ValueError("is not a Redis URL: give a redis://, rediss:// (TLS) or unix:// URL")
        return value

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if not _PREFIX_RE.match(value):
            raise ValueError(f"is not a usable key prefix: give {PREFIX_ALLOWED}")
        return value

    @field_validator("host", "spark_connect_host", "metrics_host", "ui_host")
    @classmethod
    def _host(cls, value: str | None) -> str | None:
        if value is None:
            return None
        problem = _host_problem(value)
        if problem:
            raise ValueError(problem)
        return value.strip()

    @field_validator("advertise_host")
    @classmethod
    def _advertised(cls, value: str | None) -> str | None:
        if value is None:
            return None
        problem = _advertised_problem(value)
        if problem:
            raise ValueError(problem)
        return value.strip()

    @field_validator("spark_log_level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.strip().upper() if isinstance(value, str) else value

    @field_validator("log_level", mode="before")
    @classmethod
    def _log_level(cls, value: Any) -> Any:
        value = value.strip().upper() if isinstance(value, str) else value
        return "WARNING" if value == "WARN" else value

    @field_validator("redis_appendfsync", "spark_servers", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("spark_remote")
    @classmethod
    def _spark_remote(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("sc://"):
            raise ValueError("is not a Spark Connect URL: give sc://HOST:PORT")
        return value

    @field_validator("s3_endpoint")
    @classmethod
    def _s3_endpoint(cls, value: str | None) -> str | None:
        if value is not None and urlsplit(value).scheme not in ("http", "https"):
            raise ValueError("is not an S3 endpoint: give http://HOST:PORT or https://HOST:PORT")
        return value

    @field_validator("speculation", mode="before")
    @classmethod
    def _speculation(cls, value: Any) -> Any:
        # The forms SpeculationConfig.parse (services/jobs/speculation_config.py) reads.
        from sluice.services.jobs.speculation_config import FORMS, SpeculationConfig

        text = str(value).strip().lower()
        try:
            SpeculationConfig.parse(text)
        except ConfigError:
            raise ValueError(f"is not a speculation setting: {FORMS}") from None
        return text

    @field_validator("fact_retention", mode="before")
    @classmethod
    def _fact_retention(cls, value: Any) -> Any:
        # The forms FactRetention.parse (services/jobmanager/retention.py) reads.
        text = str(value).strip().lower()
        if text != "keep" and not re.fullmatch(r"\d+|\d+(?:\.\d+)?d", text):
            raise ValueError(
                "is not a fact retention: give 'keep' (the default), a number of archived jobs whose facts "
                "are kept (e.g. 1000), or days (e.g. 30d)"
            )
        return text

    @field_validator("storage_root")
    @classmethod
    def _storage_root(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("is empty: give a file:// URI")
        return value

    @model_validator(mode="after")
    def _heartbeats(self) -> Settings:
        if self.heartbeat_timeout_ms <= self.heartbeat_interval_ms:
            raise ValueError(
                f"heartbeat timeout ({self.heartbeat_timeout_ms} ms) must be longer than the heartbeat "
                f"interval ({self.heartbeat_interval_ms} ms); a few intervals is usual"
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        planned = _plan.get()
        if planned is not None:  # load(): flags, then the environment given, then the file
            return (init_settings, *planned)
        return (init_settings, env_settings)  # Settings(...) in code: its arguments, then os.environ

    # -- views -----------------------------------------------------------------------------------

    def secret(self, name: str) -> str | None:
        """The plain text of a secret setting (None: unset)."""
        value = getattr(self, name)
        return value.get_secret_value() if isinstance(value, SecretStr) else value

    @property
    def rq_url(self) -> str | None:
        """The Redis of RQ's slot queues: rq_redis_url, else the log's (None: the embedded one)."""
        return self.rq_redis_url or self.redis_url

    def storage_root_uri(self) -> str:
        """The storage root: given, or ``<home>/storage`` as a file:// URI."""
        return self.storage_root or (self.home / "storage").resolve().as_uri()


# --- what each setting is, by name --------------------------------------------------------------


def _spec(name: str, info: FieldInfo) -> Spec:
    extra = info.json_schema_extra
    assert isinstance(extra, dict)
    flag = extra["flag"]
    aliases = extra["aliases"]
    commands = extra["commands"]
    assert isinstance(aliases, list) and isinstance(commands, list)
    return Spec(
        name=name,
        meaning=info.description or "",
        allowed=str(extra["allowed"]),
        flag=str(flag) if flag else None,
        aliases=tuple(str(a) for a in aliases),
        commands=tuple(str(c) for c in commands),
        metavar=str(extra["metavar"] or ""),
        secret=bool(extra["secret"]),
    )


@functools.cache
def specs() -> Mapping[str, Spec]:
    """Every setting's Spec, in declaration order."""
    return MappingProxyType({name: _spec(name, info) for name, info in Settings.model_fields.items()})


def default(name: str) -> Any:
    return Settings.model_fields[name].default


def describe(name: str) -> str:
    """How ``name`` is set: its flag (and the commands that take it), variable and file key."""
    spec = specs()[name]
    parts = []
    if spec.flag:
        where = "" if not spec.commands else " of " + " / ".join(f"`sluice {c}`" for c in spec.commands)
        parts.append(f"flag {spec.flag}{where}")
    parts.append(f"${spec.env}")
    parts.append(f"key {spec.key} in the settings file")
    return ", ".join(parts)


# --- resolving: flags > environment > file > default --------------------------------------------


class _Environ(EnvSettingsSource):
    """The ``SLUICE_*`` variables of a given environment (not necessarily os.environ)."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(self._environ, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str)


@dataclass(frozen=True)
class Resolved:
    """The settings in effect, where each value came from (``flag``, ``env``, ``file``,
    ``default``), and the settings file read (None: none)."""

    settings: Settings
    origin: dict[str, str]
    file: Path | None

    def source(self, name: str) -> str:
        """Where ``name``'s value came from, as `sluice config show` says it."""
        origin = self.origin[name]
        return f"file {self.file}" if origin == "file" else origin


def config_file(flags: Mapping[str, Any], config: str | Path | None, environ: Mapping[str, str]) -> Path | None:
    """The settings file: ``config`` (--config), else $SLUICE_CONFIG (both must exist), else
    ``sluice.toml`` in the home folder if there is one there (the home given by flag or
    variable, else the default)."""
    named = config if config is not None else environ.get(CONFIG_ENV) or None
    if named is not None:
        path = Path(named).expanduser()
        where = "--config" if config is not None else f"${CONFIG_ENV}"
        if not path.is_file():
            raise ConfigError(
                f"{where}={str(named)!r}: no such settings file; give the path of a TOML file, or leave it out "
                f"to read {CONFIG_FILE} in the home folder"
            )
        return path
    home = flags.get("home") or environ.get(ENV_PREFIX + "HOME") or default("home")
    found = Path(str(home)).expanduser() / CONFIG_FILE
    return found if found.is_file() else None


def resolve(
    flags: Mapping[str, Any] | None = None,
    *,
    config: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> Resolved:
    """The settings from ``flags`` (setting name -> value given on the command line), then
    ``environ`` (default os.environ), then the settings file, then the defaults.
    ConfigError, naming the setting, for a bad value or an unknown key."""
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    environ = os.environ if environ is None else environ
    path = config_file(flags, config, environ)
    env = _Environ(Settings, environ)
    try:
        file = TomlConfigSettingsSource(Settings, toml_file=path) if path else None
    except (OSError, ValueError) as exc:  # tomllib.TOMLDecodeError is a ValueError
        raise ConfigError(f"the settings file {path} cannot be read as TOML: {exc}") from None
    from_env = env()
    from_file = file() if file else {}
    origin = {
        name: "flag" if name in flags else "env" if name in from_env else "file" if name in from_file else "default"
        for name in Settings.model_fields
    }
    token = _plan.set((env, file) if file else (env,))
    try:
        settings = Settings(**flags)
    except ValidationError as exc:
        raise _config_error(exc, origin, path, flags, from_env, from_file) from None
    finally:
        _plan.reset(token)
    return Resolved(settings, origin, path)


def load(
    flags: Mapping[str, Any] | None = None,
    *,
    config: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """``resolve(...).settings``."""
    return resolve(flags, config=config, environ=environ).settings


def spelled(name: str, origin: str, path: Path | None) -> str:
    """``name`` as the source that gave its value spells it: ``--flag``, ``$SLUICE_NAME``,
    ``name in FILE``, ``name (default)``."""
    spec = specs()[name]
    if origin == "flag" and spec.flag:
        return spec.flag.split("/")[0]
    if origin == "env":
        return f"${spec.env}"
    if origin == "file":
        return f"{name} in {path}"
    return f"{name} (default)"


def given(name: str, origin: str, path: Path | None, shown: str) -> str:
    """``name`` given the value ``shown``, as its source spells it: ``--flag=5``,
    ``$SLUICE_NAME=5``, ``name=5 in FILE``."""
    if origin == "file":
        return f"{name}={shown} in {path}"
    return f"{spelled(name, origin, path)}={shown}"


def _config_error(
    exc: ValidationError,
    origin: Mapping[str, str],
    path: Path | None,
    flags: Mapping[str, Any],
    from_env: Mapping[str, Any],
    from_file: Mapping[str, Any],
) -> ConfigError:
    all_specs = specs()
    lines = []
    for error in exc.errors():
        loc = error["loc"]
        name = str(loc[0]) if loc else None
        message = str(error.get("msg", ""))
        if message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        if name is None:  # a check across settings
            lines.append(message + _across(message))
            continue
        if error["type"] == "extra_forbidden":
            lines.append(
                f"{name} in {path} is not a setting: the keys are "
                + ", ".join(all_specs)
                + " (`sluice config show` lists them with their values)"
            )
            continue
        spec = all_specs[name]
        raw = {**from_file, **from_env, **flags}.get(name, error.get("input"))
        shown = "***" if spec.secret else repr(redact(raw) if isinstance(raw, str) and "://" in raw else raw)
        reason = message if error["type"] == "value_error" else f"is not allowed: give {spec.allowed}"
        lines.append(f"{given(name, origin[name], path, shown)} {reason} (setting {name}: {describe(name)})")
    return ConfigError("; ".join(lines))


def _across(message: str) -> str:
    if "heartbeat" in message:
        return (
            f" (settings heartbeat_timeout_ms: {describe('heartbeat_timeout_ms')}; "
            f"heartbeat_interval_ms: {describe('heartbeat_interval_ms')})"
        )
    return ""


def check_deploy_timeout(resolved: Resolved) -> None:
    """A deployment must be given at least twice the heartbeat timeout: a TaskManager's slot
    reports need that long to answer for it (the JobManager checks it at start)."""
    s = resolved.settings
    if s.deploy_timeout_s * 1000 < 2 * s.heartbeat_timeout_ms:
        least = -(-2 * s.heartbeat_timeout_ms // 1000)
        raise ConfigError(
            f"{given('deploy_timeout_s', resolved.origin['deploy_timeout_s'], resolved.file, str(s.deploy_timeout_s))}"
            f" s is shorter than twice the heartbeat timeout ({s.heartbeat_timeout_ms} ms): a "
            f"TaskManager's slot reports need that long to answer for a deployment; give at least {least} s "
            f"(setting deploy_timeout_s: {describe('deploy_timeout_s')})"
        )


# --- handing the values on ----------------------------------------------------------------------


def environ_value(settings: Settings, name: str) -> str | None:
    """``name``'s value as its variable spells it (None: unset)."""
    value = getattr(settings, name)
    if value is None:
        return None
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def export_environ(resolved: Resolved, environ: dict[str, str] | None = None) -> dict[str, str | None]:
    """Put in ``environ`` (default os.environ) the variable of every setting whose value came
    from a flag or the file, so that code reading its variable deep in a service, and every
    process this one starts, sees the value in effect (and $SLUICE_CONFIG, the file read, so
    that they read the same one). Returns what it replaced (variable ->
    old value or None), for ``restore_environ``."""
    target: dict[str, str] | Any = os.environ if environ is None else environ
    replaced: dict[str, str | None] = {}
    all_specs = specs()
    for name, origin in resolved.origin.items():
        if origin not in ("flag", "file"):
            continue
        value = environ_value(resolved.settings, name)
        if value is None:
            continue
        env = all_specs[name].env
        replaced[env] = target.get(env)
        target[env] = value
    if resolved.file is not None:  # the processes it starts read that file, not another one in their home
        replaced.setdefault(CONFIG_ENV, target.get(CONFIG_ENV))
        target[CONFIG_ENV] = str(resolved.file.resolve())
    return replaced


def restore_environ(replaced: Mapping[str, str | None], environ: dict[str, str] | None = None) -> None:
    target: dict[str, str] | Any = os.environ if environ is None else environ
    for env, old in replaced.items():
        if old is None:
            target.pop(env, None)
        else:
            target[env] = old


# --- start-up: the folders a process writes -----------------------------------------------------


def _file_path(uri: str) -> Path | None:
    parts = urlsplit(uri)
    if parts.scheme == "file":
        return Path(unquote(parts.path))
    if not parts.scheme:
        return Path(uri)
    return None  # s3:// and the like: checked by the storage layer


def check_writable(resolved: Resolved, *, storage: bool) -> None:
    """Refuse to start (ConfigError naming the folder, the setting and why) when this
    process cannot write its home, its log folder or (``storage``: the JobManager and the
    embedded cluster) a ``file://`` storage root. Each is made if missing and a file is
    written and removed in it: what the process will do, so nothing loops on it later."""
    s = resolved.settings
    home_from = spelled("home", resolved.origin["home"], resolved.file)
    folders = [("home", s.home, f"from {home_from}"), ("log folder", s.home / "logs", f"in the home, from {home_from}")]
    if storage:
        root = _file_path(s.storage_root_uri())
        if root is not None:
            given = resolved.origin["storage_root"] != "default"
            how = f"from {spelled('storage_root', resolved.origin['storage_root'], resolved.file)}"
            folders.append(("storage root", root, how if given else f"<home>/storage; home {home_from}"))
    for what, folder, how in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=folder, prefix=".sluice-write-check-"):
                pass
        except OSError as exc:
            reason = _why(folder, exc)
            name = "storage_root" if what == "storage root" else "home"
            raise ConfigError(
                f"the {what} {folder} ({how}) is not writable: {reason}; give a folder {_user()} can write "
                f"(setting {name}: {describe(name)})"
            ) from None


def _why(folder: Path, exc: OSError) -> str:
    """Why ``folder`` cannot be written, in words: the file in its way, or the OS's reason."""
    for part in (folder, *folder.parents):
        if part.exists() and not part.is_dir():
            return f"{part} is a file, not a folder"
    reason = exc.strerror or str(exc)
    if exc.filename and folder not in (Path(exc.filename), Path(exc.filename).parent):  # not our probe file
        reason += f" ({exc.filename})"
    return reason


def _user() -> str:
    try:
        import pwd

        return f"user {pwd.getpwuid(os.getuid()).pw_name!r}"
    except (ImportError, KeyError):
        return "this user"
