"""The probe that decides whether the hosts suite runs, and says why not."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tools.hosts import unavailable
from tools.hosts.storage import weed

pytestmark = [pytest.mark.hosts, pytest.mark.skipif(os.geteuid() != 0, reason="the probe's own checks need root")]


def test_hosts_are_available_here(hosts_available: None) -> None:
    assert unavailable() is None


def test_a_missing_tool_is_named_with_how_to_install_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no ip, nsenter, ... on it (restored after)
    why = unavailable()
    assert why is not None and "missing tools: ip, nsenter" in why and "apt-get install" in why


def test_missing_seaweedfs_is_named_with_the_pip_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # The system tools on PATH but no weed there, nor next to the Python.
    tools = tmp_path / "bin"
    tools.mkdir()
    for name in ("ip", "nsenter", "unshare", "iptables", "faketime", "redis-server", "tar", "fusermount3"):
        found = shutil.which(name)
        assert found, name
        (tools / name).symlink_to(found)
    monkeypatch.setenv("PATH", str(tools))
    monkeypatch.setattr("sys.executable", str(tmp_path / "python"))
    assert weed() is None
    why = unavailable()
    assert why is not None and "SeaweedFS is not installed" in why and "pip install" in why


def test_no_namespaces_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # An `ip` that cannot make a namespace, as in a container without CAP_SYS_ADMIN.
    tools = tmp_path / "bin"
    tools.mkdir()
    for name in ("nsenter", "unshare", "iptables", "faketime", "redis-server", "tar", "fusermount3"):
        (tools / name).symlink_to(shutil.which(name) or name)
    (tools / "ip").write_text(
        "#!/bin/sh\necho 'mount --make-shared /run/netns failed: Operation not permitted' >&2\nexit 1\n"
    )
    (tools / "ip").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:/usr/bin:/bin")
    why = unavailable()
    assert why is not None and "cannot make a network namespace" in why and "Operation not permitted" in why


def test_a_host_whose_holder_pid_is_now_ours_has_no_processes(tmp_path: Path) -> None:
    """The holder died and its pid went to a process of the machine's own mount namespace:
    matching by that namespace would take every process of the machine for the host's (and
    kill_host would kill them all). Such a host has none."""
    import os

    from tools.hosts import Host

    host = Host("tm9", "slh-none-tm9", "veth-none", "198.18.0.99", tmp_path, holder=os.getpid())
    assert host.pids() == []
