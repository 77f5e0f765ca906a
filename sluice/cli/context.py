"""What every command shares: settings, the embedded cluster, and the one connection."""

from __future__ import annotations

import atexit
from dataclasses import dataclass, field

from sluice.config import Settings
from sluice.services.embedded import EmbeddedCluster
from sluice.store import EventLog, Keys, open_backend
from sluice.store.connection import rq_url
from sluice.store.wait import Wait

__all__ = ["Context"]


@dataclass
class Context:
    settings: Settings
    _log: EventLog | None = field(default=None, init=False)
    _cluster: EmbeddedCluster | None = field(default=None, init=False)

    @property
    def cluster(self) -> EmbeddedCluster:
        if self._cluster is None:
            self._cluster = EmbeddedCluster(self.settings.home, prefix=self.settings.prefix)
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
            self._log = EventLog(open_backend(self.url), Keys(self.settings.prefix))
            self._log.wait = Wait(self.settings.redis_wait_replicas, self.settings.redis_wait_timeout_ms)
        return self._log

    def rq_url(self) -> str:
        """The single Redis of RQ's slot queues: --rq-redis, or the log's (ConfigError when
        the log is on a Redis Cluster and none is given: RQ is not cluster-safe)."""
        return rq_url(self.url, self.settings.rq_redis_url)
