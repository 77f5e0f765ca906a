"""Whether hosts can be made here, and if not, why: the reason a skipped test shows."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from pathlib import Path

from . import storage

__all__ = ["unavailable", "TOOLS"]

TOOLS = ("ip", "nsenter", "unshare", "iptables", "faketime", "redis-server", "tar")


def unavailable() -> str | None:
    """None when network namespaces, mount namespaces, FUSE and SeaweedFS all work; otherwise
    what is missing and what to do about it."""
    if os.geteuid() != 0:
        return "the hosts harness needs root (network namespaces, mounts, iptables): run as root"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"missing tools: {', '.join(missing)} (Debian: apt-get install iproute2 util-linux iptables faketime redis-server)"
    if not Path("/dev/fuse").exists():
        return "no /dev/fuse: FUSE is not available here (load the fuse module, or give the container /dev/fuse)"
    if shutil.which("fusermount3") is None and shutil.which("fusermount") is None:
        return "fusermount is not installed (Debian: apt-get install fuse3)"
    if storage.weed() is None:  # (scripts/hosts up and the test fixture install it first)
        return "SeaweedFS is not installed: " + storage.install_hint()
    name = f"slh-probe-{secrets.token_hex(3)}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True, timeout=10)
    if made.returncode:
        return f"cannot make a network namespace (`ip netns add`): {made.stderr.strip()[:200]}"
    try:
        tried = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                name,
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                "mount -t tmpfs tmpfs /tmp",
            ],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if tried.returncode:
            return f"cannot give a namespace its own /tmp (`unshare --mount`): {tried.stderr.strip()[:200]}"
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)
    return None
