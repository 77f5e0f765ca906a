"""One host: a network namespace and a mount namespace of its own with a private tmpfs
``/tmp``, held open by a long-lived holder process; every process of the host is started
with ``nsenter`` into the holder's namespaces, so all of them share that ``/tmp``
(``ip netns exec`` alone would give each command its own mount namespace).

A host's processes are found by their mount namespace (``/proc/PID/ns/mnt``), so a kill of
the host reaches every process on it, children included, and nothing elsewhere.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tools.chaos import procs

from .net import HostsError, sh

__all__ = ["Host", "TMP_SIZE"]

TMP_SIZE = "2g"


@dataclass
class Host:
    name: str
    """Short name (``redis``, ``tm1``): what the host is for."""
    namespace: str
    veth: str
    address: str
    directory: Path
    """This host's directory in the run directory (logs, home): visible from every host."""
    holder: int = 0
    clock_offset: str | None = None
    """A ``faketime`` offset (e.g. ``+30s``) for processes started on this host from now on."""
    started: list[tuple[int, int]] = field(default_factory=list)

    def start_holder(self, timeout: float = 10.0) -> int:
        cmd = [
            "ip",
            "netns",
            "exec",
            self.namespace,
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            f"mount -t tmpfs -o size={TMP_SIZE},mode=1777 tmpfs /tmp && exec sleep infinity",
        ]
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        root_ns = os.readlink("/proc/self/ns/mnt")
        while True:
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                raise HostsError(f"the holder of host {self.name} exited ({proc.returncode}): {err.strip()[:300]}")
            argv = procs.argv(proc.pid)
            if argv[:1] == ["sleep"] and self._mnt(proc.pid) not in (None, root_ns):
                break  # the tmpfs is mounted (sh got past the mount and exec'd sleep)
            if time.monotonic() > deadline:
                proc.kill()
                raise HostsError(f"the holder of host {self.name} did not come up within {timeout:.0f} s")
            time.sleep(0.02)
        if proc.stderr:
            proc.stderr.close()
        self.holder = proc.pid
        return proc.pid

    @staticmethod
    def _mnt(pid: int) -> str | None:
        try:
            return os.readlink(f"/proc/{pid}/ns/mnt")
        except OSError:
            return None

    def enter(self) -> list[str]:
        """The prefix that runs a command on this host (its network and mount namespaces)."""
        if not self.holder:
            raise HostsError(f"host {self.name} has no holder process: start it first")
        return ["nsenter", "-t", str(self.holder), "-m", "-n", "--"]

    def spawn(
        self, argv: Sequence[str], *, log: Path, env: Mapping[str, str] | None = None, clock: bool = True
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` on this host, output to ``log``; under ``faketime`` when the host's
        clock is offset (the wall clock as a skewed NTP would leave it; durations true)."""
        full = dict(os.environ if env is None else env)
        cmd = list(argv)
        if clock and self.clock_offset:
            # The offset shifts the monotonic clock too, by a constant (durations stay true):
            # with FAKETIME_DONT_FAKE_MONOTONIC=1, libfaketime 0.9.10 makes every absolute
            # clock_nanosleep fail with EINVAL, so Python's time.sleep raised in every process.
            cmd = ["faketime", "-f", self.clock_offset, *cmd]
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [*self.enter(), *cmd],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=full,
                start_new_session=True,
            )
        who = procs.ident(proc.pid)
        if who is not None:
            self.started.append(who)
        return proc

    def run(self, *argv: str, timeout: float = 60.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a short command on this host and wait for it."""
        return sh(*self.enter(), *argv, timeout=timeout, check=check)

    def pids(self) -> list[int]:
        """Every live process of this host but its holder (by mount namespace)."""
        mine = self._mnt(self.holder) if self.holder else None
        if mine is None or mine == self._mnt(os.getpid()):
            # No holder, or its pid now belongs to a process of our own mount namespace (the
            # holder died and the pid was reused): every process of the machine would match.
            return []
        out = []
        for d in Path("/proc").iterdir():
            if (
                d.name.isdigit()
                and int(d.name) != self.holder
                and self._mnt(int(d.name)) == mine
                and procs.alive(int(d.name))
            ):
                out.append(int(d.name))
        return sorted(out)

    def kill_all(self, sig: int = signal.SIGKILL, *, keep: Sequence[int] = (), timeout: float = 10.0) -> list[int]:
        """Send ``sig`` to every process of the host but ``keep`` (and the holder); with
        SIGKILL, wait up to ``timeout`` for them to go. The pids signalled."""
        targets = [p for p in self.pids() if p not in keep]
        for p in targets:
            procs.kill(p, signal.SIGCONT)
            procs.kill(p, sig)
        if sig == signal.SIGKILL:
            left = procs.wait_gone(targets, timeout)
            if left:
                raise HostsError(f"processes {left} of host {self.name} outlived kill -9 for {timeout:.0f} s")
        return targets

    def put(self, source: Path, target: str, *, timeout: float = 300.0) -> None:
        """Copy a file or directory of the root namespace (any path, /tmp too) to ``target`` on
        this host, as a tar stream (the host does not see the root namespace's /tmp)."""
        self.run("mkdir", "-p", target)
        tar = subprocess.Popen(["tar", "-C", str(source.parent), "-cf", "-", source.name], stdout=subprocess.PIPE)
        try:
            done = subprocess.run(
                [*self.enter(), "tar", "-C", target, "-xf", "-"], stdin=tar.stdout, capture_output=True, timeout=timeout
            )
        finally:
            if tar.stdout:
                tar.stdout.close()
            tar.wait(timeout)
        if done.returncode or tar.returncode:
            raise HostsError(f"copying {source} to {target} on host {self.name} failed: {done.stderr.decode()[:300]}")

    def get(self, source: str, target: Path, *, timeout: float = 300.0) -> Path:
        """Copy ``source`` on this host into the directory ``target`` of the root namespace; the copy's path."""
        target.mkdir(parents=True, exist_ok=True)
        src = Path(source)
        done = subprocess.run(
            [*self.enter(), "tar", "-C", str(src.parent), "-cf", "-", src.name], capture_output=True, timeout=timeout
        )
        if done.returncode:
            raise HostsError(f"reading {source} on host {self.name} failed: {done.stderr.decode()[:300]}")
        subprocess.run(["tar", "-C", str(target), "-xf", "-"], input=done.stdout, check=True, timeout=timeout)
        return target / src.name
