"""A Spark Connect server from the pip-installed PySpark, shared by a TaskManager's workers
(or by a whole embedded cluster, or by a test run): one JVM, warm, and thin clients."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from sluice.config import spark_connect_host, spark_log_level
from sluice.errors import ConfigError, ServiceError

from .redis_server import free_port

__all__ = [
    "SparkConnectServer",
    "spark_home",
    "check_java",
    "wait_listening",
    "class_archive",
    "build_class_archive",
    "prune_class_archives",
]


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
        raise ServiceError(
            f"the Spark Connect server at {remote} did not listen within {timeout:.0f} s; "
            "see its log (.sluice/logs/<taskmanager>-spark-connect.log)"
        )


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
        raise ConfigError(
            "Java is not installed: Spark needs Java 17 (Debian: apt-get install openjdk-17-jre-headless)"
        )


def class_archive() -> Path | None:
    """Where the Spark server's class-data archive (JDK AppCDS) for this Java and this PySpark
    lives, whether built or not; None when ``$SLUICE_SPARK_CDS`` is ``off``. A JVM started
    with it maps the classes Spark loads instead of loading and verifying them one by one:
    measured here, the server listens in 3.5-3.9 s instead of 6.5-7.8 s and runs its first
    query in 4.7 s instead of 7.3-9 s. ``$SLUICE_SPARK_CDS`` may name the file instead;
    by default it is in ``$XDG_CACHE_HOME/sluice`` (``~/.cache/sluice``), named for what it
    was built from (an archive of another Java or PySpark install would be refused by the JVM)."""
    import hashlib
    from shutil import which

    import pyspark

    chosen = os.environ.get("SLUICE_SPARK_CDS", "").strip()
    if chosen.lower() == "off":
        return None
    if chosen:
        return Path(chosen)
    java = os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else which("java")
    if java is None:
        return None
    java = os.path.realpath(java)
    home = spark_home()  # the JVM checks the archive's class path: another install of the same jars won't do
    jars = sorted(p.name for p in (home / "jars").glob("*.jar"))
    key = hashlib.sha256(
        "\n".join([java, str(os.stat(java).st_mtime_ns), str(home), pyspark.__version__, *jars]).encode()
    )
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sluice"
    return cache / f"spark-connect-{pyspark.__version__}-{key.hexdigest()[:16]}.jsa"


# What the archive's training run does: the kinds of work Sluice's tasks ask of Spark (text
# and Parquet scans, explode, aggregation, exchanges, partitioned writes, a cache, a collect),
# so that the classes they load are in it.
_TRAINING = """
import os, sys, tempfile
from pyspark.sql import SparkSession, functions as F
spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
d = tempfile.mkdtemp(prefix="sluice-cds-")
with open(os.path.join(d, "in.txt"), "w") as f:
    f.write("the quick brown fox jumps over the lazy dog\\n" * 2000)
lines = spark.read.text(os.path.join(d, "in.txt"))
words = lines.select(F.explode(F.split(F.lower(F.col("value")), "[^a-z]+")).alias("w")).where(F.col("w") != "")
counts = words.groupBy("w").agg(F.count(F.lit(1)).alias("n"))
counts.withColumn("_kg", F.abs(F.hash("w")) % 2).repartition("_kg").write.mode("overwrite") \\
    .partitionBy("_kg").parquet(os.path.join(d, "p"))
back = spark.read.parquet(os.path.join(d, "p")).groupBy("w").agg(F.sum("n").alias("n")).cache()
back.write.mode("overwrite").parquet(os.path.join(d, "out"))
back.collect()
back.unpersist()
spark.createDataFrame([(1, 2)], "s long, e long").count()
spark.range(10).count()
import shutil
shutil.rmtree(d, ignore_errors=True)
os._exit(0)
"""


def build_class_archive(path: Path, *, timeout: float = 300.0) -> float:
    """Build the class-data archive at ``path``: a Spark Connect server runs a training
    workload and dumps the classes it loaded as it exits (a JVM dumps them at exit, which
    takes it 10-20 s here). Written next to ``path`` and renamed into place, so a server
    never maps a half-written one. Returns the seconds it took; raises ServiceError when
    the archive could not be made (Spark works without it, only slower to start)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    partial.unlink(missing_ok=True)
    began = time.monotonic()
    server = SparkConnectServer(
        log_file=path.parent / "spark-cds-build.log", cds=False, java_options=[f"-XX:ArchiveClassesAtExit={partial}"]
    )
    try:
        url = server.start(timeout=timeout)
        done = subprocess.run([sys.executable, "-c", _TRAINING, url], capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise ServiceError(f"the training run for Spark's class-data archive failed:\n{done.stderr[-2000:]}")
    finally:
        server.stop(timeout=timeout)  # the JVM writes the archive as it exits
    if not partial.is_file() or partial.stat().st_size == 0:
        raise ServiceError(f"the Spark server wrote no class-data archive at {partial}; see {server.log_file}")
    partial.replace(path)
    path.with_suffix(".source").write_text(str(spark_home()))  # for prune_class_archives
    return time.monotonic() - began


def prune_class_archives(directory: Path) -> list[Path]:
    """Remove the archives in ``directory`` built for a PySpark install that is gone (a
    deleted virtualenv or checkout): each is about 200 MB. Returns what was removed."""
    gone = []
    for source in directory.glob("spark-connect-*.source"):
        if not Path(source.read_text().strip()).is_dir():
            archive = source.with_suffix(".jsa")
            archive.unlink(missing_ok=True)
            source.unlink(missing_ok=True)
            gone.append(archive)
    return gone


class SparkConnectServer:
    """``spark-submit … SparkConnectServer`` on a free port, ``local[*]`` by default, logging
    at ``log_level`` (default: $SLUICE_SPARK_LOG_LEVEL, else WARN), listening on ``host``
    (default: $SLUICE_SPARK_CONNECT_HOST, else 127.0.0.1; ``sluice.config.spark_connect_host``)."""

    def __init__(
        self,
        *,
        master: str = "local[*]",
        port: int | None = None,
        log_file: Path | None = None,
        conf: dict[str, str] | None = None,
        log_level: str | None = None,
        cds: bool = True,
        java_options: list[str] | None = None,
        host: str | None = None,
    ) -> None:
        self.master = master
        self.host = spark_connect_host(host)
        self.java_options = list(java_options or [])
        archive = class_archive() if cds else None
        if archive is not None and archive.is_file():  # (a stale or foreign one: the JVM warns and goes without)
            self.java_options.append(f"-XX:SharedArchiveFile={archive}")
        self.log_level = spark_log_level(log_level)
        self.port = port or free_port()
        self.log_file = log_file
        self.conf = {
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "8",
            "spark.connect.grpc.binding.address": self.host,
            "spark.connect.grpc.binding.port": str(self.port),
            **(conf or {}),
        }
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        """Where this machine's processes connect to it: its host, or loopback when it
        listens on every interface."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"[{host}]" if ":" in host else host

    @property
    def url(self) -> str:
        return f"sc://{self.address}:{self.port}"

    def start(self, *, wait: bool = True, timeout: float = 120.0, detach: bool = False) -> str:
        check_java()
        home = spark_home()
        cmd = [
            str(home / "bin" / "spark-submit"),
            "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--name",
            "sluice-spark-connect",
            "--master",
            self.master,
        ]
        import tempfile

        logs = self.log_file.parent if self.log_file else Path(tempfile.gettempdir())
        config = log4j2_config(logs, self.log_level)
        cmd += [
            "--driver-java-options",
            " ".join([f"-Dlog4j2.configurationFile=file:{config}", *self.java_options]),
            "--conf",
            f"spark.log.level={self.log_level}",
        ]
        for k, v in self.conf.items():
            cmd += ["--conf", f"{k}={v}"]
        env = {
            **os.environ,
            "SPARK_HOME": str(home),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL
        from sluice.services.common.guard import guarded

        self.proc = subprocess.Popen(
            cmd if detach else guarded(cmd),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=detach,
        )
        if not isinstance(out, int):  # a log file, not DEVNULL
            out.close()
        if wait:
            self.wait_ready(timeout)
        return self.url

    def wait_ready(self, timeout: float = 120.0) -> None:
        def still_running() -> None:
            if self.proc is not None and self.proc.poll() is not None:
                raise ServiceError(
                    f"the Spark Connect server exited at start (code {self.proc.returncode}); "
                    f"see {self.log_file or 'its output'}"
                )

        if not _listens(self.address.strip("[]"), self.port, timeout, 0.2, still_running):
            raise ServiceError(
                f"the Spark Connect server did not listen on {self.address}:{self.port} within {timeout:.0f} s"
            )

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def terminate(self) -> None:
        """Ask the server to stop (SIGTERM) without waiting: its JVM takes a moment to exit,
        which can overlap stopping the rest; ``stop`` then waits for it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc is None:
            return
        self.terminate()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
