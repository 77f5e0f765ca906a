"""The Spark Connect server a TaskManager's workers use, and each task's share of it.

The server is the given one (``spark_remote``) or one the TaskManager starts itself the
first time a task needs Spark (one JVM shared by all its slots, only when its workers are
real processes on this host). A task's Spark partitions follow ``share.py``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluice.services.common.shell import hostname

from . import share

if TYPE_CHECKING:
    from sluice.services.embedded.spark_connect import SparkConnectServer

__all__ = ["SparkShare", "driver_conf"]


def driver_conf(master: str, hostname: str, environ: dict[str, str] | None = None) -> dict[str, str]:
    """Where a Spark driver of this TaskManager listens and what address it gives out, so that
    it still answers after this host's address changed (a container connected again to its
    network gets a new one). Spark's default binds the driver to the address the host name
    had at start and gives that out: after a change, connections to it are refused
    ("Connection refused: HOST/NEW_ADDRESS:PORT"), and the task fails.

    On a ``local`` master nothing outside this host talks to the driver: it listens on
    loopback and gives out loopback, which never changes. On a cluster's master the
    executors, elsewhere, must reach it: it listens on every interface and gives out the host
    name, which follows the host. Nothing is set when ``$SPARK_LOCAL_IP`` or
    ``$SPARK_LOCAL_HOSTNAME`` chooses (Spark's own settings)."""
    env = os.environ if environ is None else environ
    if env.get("SPARK_LOCAL_IP") or env.get("SPARK_LOCAL_HOSTNAME"):
        return {}
    if master.startswith("local"):
        return {"spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1"}
    return {"spark.driver.bindAddress": "0.0.0.0", "spark.driver.host": hostname}


class SparkShare:
    def __init__(
        self,
        *,
        remote: str | None,
        task_partitions: int | None,
        cores: int | None,
        shared_by: int | None,
        slots: int,
        may_start: bool,
        logs: Path,
        resource_id: str,
        logger: Any,
    ) -> None:
        self.remote = remote
        """The Spark Connect URL the workers use (None: none yet)."""
        self.task_partitions = task_partitions
        """Spark partitions every task gets (``share.py``); 0: what Spark decides; None: each
        task's share of its server's cores (below)."""
        self.cores = cores
        """The cores of the Spark server given as ``remote`` (None: unknown, unless this
        TaskManager starts its own local one)."""
        self.shared_by = shared_by
        """How many slots share the server (None: this TaskManager's ``slots``)."""
        self.slots = slots
        self.may_start = may_start
        """Whether it may start its own server (its workers are processes on this host)."""
        self.logs, self.resource_id, self.logger = logs, resource_id, logger
        self.server: SparkConnectServer | None = None
        """The server it started itself, if it did."""

    def url(self) -> str | None:
        """The Spark Connect server this TaskManager's workers use: the given one, or one it
        starts itself the first time a task needs Spark (one JVM shared by all its slots)."""
        if self.remote is None and self.may_start:
            from sluice.services.embedded.spark_connect import SparkConnectServer

            self.logs.mkdir(parents=True, exist_ok=True)
            master = os.environ.get("SLUICE_SPARK_MASTER", "local[*]")
            self.server = SparkConnectServer(
                master=master,
                log_file=self.logs / f"{self.resource_id}-spark-connect.log",
                conf=driver_conf(master, hostname()),
            )
            self.remote = self.server.start(wait=False)
            self.logger.info("started a Spark Connect server for this TaskManager", url=self.remote)
        return self.remote

    def partitions(self, parallelism: int) -> int | None:
        """The Spark partitions of a task of a vertex of ``parallelism`` subtasks here
        (``share.py``); None: Spark decides."""
        if self.task_partitions is not None:
            return self.task_partitions or None
        cores = self.cores
        if cores is None and self.server is not None:  # its own server
            cores = share.local_cores(self.server.master)
        if cores is None:
            return None
        return share.task_partitions(cores, self.shared_by or self.slots, parallelism)

    def stop(self) -> None:
        """Stop the server it started, if any."""
        if self.server is not None:
            self.server.stop()
            self.server = None
