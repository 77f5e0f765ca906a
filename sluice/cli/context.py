"""What every command shares: settings, the embedded cluster, and the one connection."""

from __future__ import annotations

import atexit
from pathlib import Path
from typing import Any

from sluice.config import (
    Resolved,
    Settings,
    check_deploy_timeout,
    check_writable,
    export_environ,
    resolve,
    restore_environ,
)
from sluice.services.embedded import EmbeddedCluster
from sluice.store import EventLog, Keys, open_backend
from sluice.store.acl import check_log_access
from sluice.store.connection import rq_url
from sluice.store.wait import Wait

__all__ = ["Context"]


class Context:
    """The settings (given, or resolved on first use from the flags of the command line,
    ``SLUICE_*`` variables and the settings file), the embedded cluster in the home, and the
    one connection to the log."""

    def __init__(
        self, settings: Settings | None = None, *, flags: dict[str, Any] | None = None, config: str | None = None
    ) -> None:
        self._given = settings
        self._flags = flags if flags is not None else {}
        self._config = config
        self._resolved: Resolved | None = None
        self._replaced: dict[str, str | None] = {}
        self._log: EventLog | None = None
        self._cluster: EmbeddedCluster | None = None

    @property
    def resolved(self) -> Resolved:
        """The settings in effect and where each came from. The first use resolves them and
        hands the values from flags and the file on to this process's variables (for the code
        that reads them, and the processes it starts); ``close`` takes them back."""
        if self._resolved is None:
            if self._given is not None:
                self._resolved = Resolved(self._given, {n: "code" for n in Settings.model_fields}, None)
            else:
                resolved = resolve(self._flags, config=self._config)
                self._replaced = export_environ(resolved)
                self._resolved = resolved
                from sluice.services.common.shell import configure_logging

                configure_logging(resolved.settings.log_level, json=resolved.settings.log_json)
        return self._resolved

    @property
    def settings(self) -> Settings:
        return self.resolved.settings

    def start(self, role: str) -> Settings:
        """The settings of a long-running process (``jobmanager``, ``taskmanager``,
        ``projector``, ``ui``, ``run``, ``cluster``), refused at start (ConfigError) when a
        value is bad or a folder it writes is not writable."""
        resolved = self.resolved
        check_writable(resolved, storage=role in ("jobmanager", "run", "cluster"))
        if role == "jobmanager":
            check_deploy_timeout(resolved)
        return resolved.settings

    def close(self) -> None:
        restore_environ(self._replaced)
        self._replaced = {}

    @property
    def cluster(self) -> EmbeddedCluster:
        if self._cluster is None:
            self._cluster = EmbeddedCluster(Path(self.settings.home), prefix=self.settings.prefix)
        return self._cluster

    @property
    def url(self) -> str:
        """The Redis URL: given, or the embedded one (brought back on its data if down)."""
        if self.settings.redis_url:
            return self.settings.redis_url
        already = self.cluster.transient_redis
        url = self.cluster.redis_url()
        if self.cluster.transient_redis and not already:
            atexit.register(self.cluster.stop_redis)
        return url

    def log(self) -> EventLog:
        if self._log is None:
            url, keys = self.url, Keys(self.settings.prefix)
            backend = open_backend(url)
            # What the Redis user may do, told at the start (RQ's part: on its own Redis when given).
            check_log_access(backend, keys, url, rq=self.settings.rq_redis_url in (None, url))
            self._log = EventLog(backend, keys)
            self._log.wait = Wait(self.settings.redis_wait_replicas, self.settings.redis_wait_timeout_ms)
        return self._log

    def rq_url(self) -> str:
        """The single Redis of RQ's slot queues: --rq-redis, or the log's (ConfigError when
        the log is on a Redis Cluster and none is given: RQ is not cluster-safe)."""
        return rq_url(self.url, self.settings.rq_redis_url)
