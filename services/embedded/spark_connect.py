"""A Spark Connect server from the pip-installed PySpark, shared by a TaskManager's workers
(or by a whole embedded cluster, or by a test run): one JVM, warm, and thin clients."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from sluice.config import spark_log_level
from sluice.errors import ConfigError, ServiceError

from .redis_server import free_port

__all__ = ["SparkConnectServer", "spark_home", "check_java", "wait_listening"]


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


# Plain lines on stderr (which start() sends to the log file), at the level asked for; the
# same layout as Spark's own defaults without its JSON structured logging.
_LOG4J2 = """\
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
"""


def log4j2_config(directory: Path, level: str) -> Path:
    """A log4j2 configuration file for a Spark JVM logging at ``level``, written in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"sluice-log4j2-{level.lower()}.properties"
    path.write_text(_LOG4J2.format(level=level.lower()))
    return path


def wait_listening(remote: str, timeout: float = 180.0, *, poll: float = 0.1) -> None:
    """Return once the Spark Connect server at ``remote`` (``sc://host:port[/;params]``)
    accepts connections. A client made before that backs off exponentially inside gRPC
    (50 ms times 4 each try, up to a minute between tries), so a task started while its
    TaskManager's server was still coming up waited up to a minute past the moment the
    server listened; polling the port first costs one connect per ``poll``. Raises
    ServiceError naming the address when it does not listen within ``timeout``."""
    from urllib.parse import urlparse

    parsed = urlparse(remote.split(";", 1)[0].rstrip("/"))
    if parsed.scheme != "sc" or not parsed.hostname:
        raise ConfigError(f"{remote!r} is not a Spark Connect address (sc://host:port)")
    if not _listens(parsed.hostname, parsed.port or 15002, timeout, poll):
        raise ServiceError(f"the Spark Connect server at {remote} did not listen within {timeout:.0f} s; "
                           "see its log (.sluice/logs/<taskmanager>-spark-connect.log)")


def _listens(host: str, port: int, timeout: float, poll: float, check: Callable[[], None] | None = None) -> bool:
    """Whether ``host:port`` accepts a connection within ``timeout``, trying every ``poll``
    seconds; ``check`` runs before each try (and may raise to give up early)."""
    import socket

    deadline = time.monotonic() + timeout
    while True:
        if check is not None:
            check()
        try:
            with socket.create_connection((host, port), timeout=max(poll, 0.2)):
                return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll)


def check_java() -> None:
    from shutil import which

    if which("java") is None and not os.environ.get("JAVA_HOME"):
        raise ConfigError("Java is not installed: Spark needs Java 17 (Debian: apt-get install openjdk-17-jre-headless)")


class SparkConnectServer:
    """``spark-submit … SparkConnectServer`` on a free port, ``local[*]`` by default, logging
    at ``log_level`` (default: $SLUICE_SPARK_LOG_LEVEL, else WARN)."""

    def __init__(self, *, master: str = "local[*]", port: int | None = None, log_file: Path | None = None,
                 conf: dict[str, str] | None = None, log_level: str | None = None) -> None:
        self.master = master
        self.log_level = spark_log_level(log_level)
        self.port = port or free_port()
        self.log_file = log_file
        self.conf = {
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "8",
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            **(conf or {}),
        }
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def start(self, *, wait: bool = True, timeout: float = 120.0, detach: bool = False) -> str:
        check_java()
        home = spark_home()
        cmd = [str(home / "bin" / "spark-submit"), "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
               "--name", "sluice-spark-connect", "--master", self.master]
        import tempfile

        logs = self.log_file.parent if self.log_file else Path(tempfile.gettempdir())
        config = log4j2_config(logs, self.log_level)
        cmd += ["--driver-java-options", f"-Dlog4j2.configurationFile=file:{config}",
                "--conf", f"spark.log.level={self.log_level}"]
        for k, v in self.conf.items():
            cmd += ["--conf", f"{k}={v}"]
        env = {**os.environ, "SPARK_HOME": str(home), "PYSPARK_PYTHON": sys.executable,
               "PYSPARK_DRIVER_PYTHON": sys.executable}
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL
        from sluice.services.common.guard import guarded

        self.proc = subprocess.Popen(cmd if detach else guarded(cmd), stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env, start_new_session=detach)
        if not isinstance(out, int):  # a log file, not DEVNULL
            out.close()
        if wait:
            self.wait_ready(timeout)
        return self.url

    def wait_ready(self, timeout: float = 120.0) -> None:
        def still_running() -> None:
            if self.proc is not None and self.proc.poll() is not None:
                raise ServiceError(f"the Spark Connect server exited at start (code {self.proc.returncode}); "
                                   f"see {self.log_file or 'its output'}")

        if not _listens("127.0.0.1", self.port, timeout, 0.2, still_running):
            raise ServiceError(f"the Spark Connect server did not listen on port {self.port} within {timeout:.0f} s")

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def terminate(self) -> None:
        """Ask the server to stop (SIGTERM) without waiting: its JVM takes a moment to exit,
        which can overlap stopping the rest; ``stop`` then waits for it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
