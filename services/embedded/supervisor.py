"""The embedded cluster: one data directory (default ``.sluice/``) holding the Redis AOF,
the logs of every process, and ``cluster.json`` naming what runs, so that later
commands find it again (and bring Redis back on the same data if it is down)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluice.config import appendfsync
from sluice.errors import ConfigError, RedisUnavailable
from sluice.services.common.shell import new_id
from sluice.store.connection import ping

from .redis_server import RedisServer, stop_server

if TYPE_CHECKING:
    from .spark_connect import SparkConnectServer

__all__ = ["EmbeddedCluster", "ProcessInfo", "alive", "descendants", "Stopped"]

_SHORT = {"taskmanager": "tm", "jobmanager": "jm", "projector": "projector"}


def _stop_pid(pid: int, timeout: float = 20.0) -> None:
    """SIGTERM a process another command started, and wait for it to go (a JVM takes a
    second or two): `sluice cluster stop` returned while the Spark server was still
    shutting down, and one started right after found it there. SIGKILL after ``timeout``."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            return
        time.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); reap it if it is ours, else ask /proc.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done != 0:
            return False
    except ChildProcessError:
        pass
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return not Path("/proc").is_dir()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _ours(pid: int, *marks: str) -> bool:
    """Whether ``pid`` still runs one of our programs (not a stranger that got a recycled
    pid): its command line holds one of ``marks``. Without /proc, trust the pid."""
    if not Path("/proc").is_dir():
        return alive(pid)
    cmd = _cmdline(pid)
    return alive(pid) and any(m in cmd for m in marks)


def descendants(pids: list[int]) -> list[int]:
    """Every live process below ``pids`` (their children, grandchildren, ...), from /proc:
    a TaskManager's RQ workers and the Spark Connect server it may have started."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d.name))
    out: list[int] = []
    todo = list(pids)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.append(child)
                todo.append(child)
    return [p for p in out if alive(p)]


@dataclass
class ProcessInfo:
    role: str
    pid: int
    name: str


@dataclass
class Stopped:
    """What ``stop_everything`` did, for the user: (what, pid) per way each process went."""

    terminated: list[tuple[str, int]]
    killed: list[tuple[str, int]]


class EmbeddedCluster:
    def __init__(self, home: Path, *, prefix: str = "sluice", env: dict[str, str] | None = None) -> None:
        self.home = Path(home)
        self.prefix = prefix
        self.env = env or {}
        self.state_file = self.home / "cluster.json"
        self.logs = self.home / "logs"
        self._server: RedisServer | None = None
        self._spark: SparkConnectServer | None = None
        self.transient_redis = False
        """True when this process started Redis just for itself (to stop it when done)."""

    # --- state file ----------------------------------------------------------------------

    def _read(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self.state_file.read_text())
            return data
        except FileNotFoundError:
            return {}
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{self.state_file} is damaged ({exc}); remove it and start the cluster again") from exc

    def _write(self, data: dict[str, Any]) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        tmp.replace(self.state_file)

    # --- redis ---------------------------------------------------------------------------

    def redis_url(self, *, start: bool = True, detach: bool = False) -> str:
        """The URL of the embedded Redis: the recorded one if it answers, else a new server
        on the same data directory (so a finished run's log can still be read)."""
        data = self._read()
        rec = data.get("redis")
        if rec and ping(rec["url"]):
            return str(rec["url"])
        if not start:
            raise RedisUnavailable(f"no embedded Redis runs for {self.home}; start one with `sluice cluster start`")
        server = RedisServer(self.home / "redis", fsync=appendfsync(self.env.get("SLUICE_REDIS_APPENDFSYNC")))
        url = server.start(detach=detach)
        self._server = server
        self.transient_redis = not detach
        data["redis"] = {"url": url, "pid": server.pid, "port": server.port}
        self._write(data)
        return url

    def redis_record(self) -> dict[str, Any] | None:
        """What ``cluster.json`` says of the embedded Redis (url, pid, port), if anything."""
        rec = self._read().get("redis")
        return dict(rec) if rec else None

    def stop_redis(self) -> None:
        data = self._read()
        rec = data.pop("redis", None)
        if self._server is not None:
            self._server.stop()
            self._server = None
        elif rec:
            stop_server(int(rec["port"]))
        self._write(data)

    # --- spark ---------------------------------------------------------------------------

    def start_spark(self, *, master: str = "local[*]", detach: bool = True) -> str:
        """One Spark Connect server for the embedded cluster's workers (thin clients)."""
        from .spark_connect import SparkConnectServer

        self.logs.mkdir(parents=True, exist_ok=True)
        server = SparkConnectServer(master=master, log_file=self.logs / "spark-connect.log")
        url = server.start(wait=False, detach=detach)
        self._spark = server
        data = self._read()
        data["spark"] = {"url": url, "pid": server.pid}
        self._write(data)
        self.env["SLUICE_SPARK_REMOTE"] = url
        return url

    def shared_spark(self) -> str | None:
        """The URL of the Spark Connect server this cluster started for all its TaskManagers,
        if it still runs."""
        rec = self._read().get("spark")
        return str(rec["url"]) if rec and _ours(int(rec["pid"]), "SparkConnectServer", "spark") else None

    def wait_spark(self, timeout: float = 120.0) -> None:
        if self._spark is not None:
            self._spark.wait_ready(timeout)

    def spark_going(self) -> None:
        """Ask the Spark server this process started to stop, without waiting (``stop_spark``
        waits): once its clients are gone, so that its JVM exits while the rest of the
        cluster stops."""
        if self._spark is not None:
            self._spark.terminate()

    def stop_spark(self) -> None:
        data = self._read()
        rec = data.pop("spark", None)
        if self._spark is not None:
            self._spark.stop()
            self._spark = None
        elif rec and alive(int(rec["pid"])):
            _stop_pid(int(rec["pid"]))
        self._write(data)

    def storage_root(self) -> str:
        return (self.home / "storage").resolve().as_uri()

    # --- processes -----------------------------------------------------------------------

    def processes(self, role: str | None = None) -> list[ProcessInfo]:
        out = [ProcessInfo(**p) for p in self._read().get("processes", [])]
        return [p for p in out if alive(p.pid) and (role is None or p.role == role)]

    def spawn(self, role: str, url: str, *args: str, name: str | None = None, detach: bool = True) -> ProcessInfo:
        self.logs.mkdir(parents=True, exist_ok=True)
        name = name or f"{_SHORT.get(role, role)}-{new_id()[:6]}"
        cmd = [
            sys.executable,
            "-m",
            "sluice",
            "--redis",
            url,
            "--prefix",
            self.prefix,
            "--home",
            str(self.home),
            role,
            *args,
        ]
        if role == "taskmanager":
            cmd += ["--resource-id", name]
        log = open(self.logs / f"{name}.log", "ab")
        env = {**os.environ, **self.env}
        if role == "taskmanager" and "SLUICE_SPARK_REMOTE" not in env:
            shared = self.shared_spark()
            if shared:
                env["SLUICE_SPARK_REMOTE"] = shared  # a TaskManager added later (`sluice scale`) uses it too
        from sluice.services.common.guard import guarded

        proc = subprocess.Popen(
            cmd if detach else guarded(cmd),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=detach,
            env=env,
        )
        log.close()
        info = ProcessInfo(role, proc.pid, name)
        data = self._read()
        data["processes"] = [p for p in data.get("processes", []) if alive(p["pid"])] + [info.__dict__]
        self._write(data)
        return info

    def stop_everything(self, *, grace: float = 10.0) -> Stopped:
        """Stop every process this cluster started without asking Redis anything (it may be
        dead): the recorded JobManagers, TaskManagers and projector, the RQ workers and Spark
        Connect servers below them, the recorded Spark Connect server and Redis. SIGTERM
        first, SIGKILL for whatever still runs after ``grace`` seconds."""
        data = self._read()
        targets: dict[int, str] = {}
        for p in data.get("processes", []):
            if _ours(int(p["pid"]), "sluice"):
                targets[int(p["pid"])] = f"{p['role']} {p['name']}"
        for pid in descendants(list(targets)):  # found before their parents go (then they move to init)
            cmd = _cmdline(pid)
            what = (
                "RQ worker"
                if " worker " in cmd
                else "Spark Connect server"
                if "SparkConnectServer" in cmd
                else "guard"
                if "sluice.services.common.guard" in cmd
                else "child"
            )
            targets.setdefault(pid, f"{what} (child of the cluster)")
        spark = data.get("spark")
        if spark and _ours(int(spark["pid"]), "SparkConnectServer", "spark"):
            targets.setdefault(int(spark["pid"]), "Spark Connect server")
        redis = data.get("redis")
        if redis and redis.get("pid") and _ours(int(redis["pid"]), "redis-server"):
            targets.setdefault(int(redis["pid"]), "redis-server")
        terminated: list[tuple[str, int]] = []
        for pid in targets:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(alive(p) for p in targets):
            time.sleep(0.05)
        killed: list[tuple[str, int]] = []
        for pid, what in targets.items():
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append((what, pid))
                except ProcessLookupError:
                    terminated.append((what, pid))
            else:
                terminated.append((what, pid))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(alive(p) for _, p in killed):
            time.sleep(0.05)
        self._server = None
        self._spark = None
        for key in ("processes", "spark", "redis"):
            data.pop(key, None)
        self._write(data)
        return Stopped(terminated, killed)

    def terminate(self, infos: list[ProcessInfo], *, timeout: float = 15.0) -> None:
        """SIGTERM (graceful: TaskManagers unregister), then SIGKILL what is left."""
        for p in infos:
            try:
                os.kill(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(alive(p.pid) for p in infos):
            time.sleep(0.05)
        for p in infos:
            if alive(p.pid):
                os.kill(p.pid, signal.SIGKILL)
        gone = {p.pid for p in infos}
        data = self._read()
        data["processes"] = [p for p in data.get("processes", []) if p["pid"] not in gone and alive(p["pid"])]
        self._write(data)
