"""Removing what a run made, in reverse: every process (found by pid and start time, and by the
hosts' mount namespaces), the FUSE and bind mounts (they go with the last process of their
mount namespace, and are lazily unmounted first), the namespaces (iptables rules inside go
with them), the links and the bridge, the run directory, and the state file last. Each step
is bounded and goes on when a piece is already gone, so it may run twice, or on a run that
died half-way up.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from tools.chaos import procs

from .net import sh
from .state import RunState, runs

if TYPE_CHECKING:
    from .host import Host

__all__ = ["clean", "clean_leftovers", "leftovers"]


def _mnt(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def _processes(state: RunState) -> list[int]:
    """Live processes of the run: the recorded ones, and every process in a recorded holder's mount namespace."""
    found = {who[0] for who in state.pids if procs.same(who)}
    spaces = {m for who in state.holders.values() if procs.same(who) and (m := _mnt(who[0]))}
    if spaces:
        for d in Path("/proc").iterdir():
            if d.name.isdigit() and _mnt(int(d.name)) in spaces:
                found.add(int(d.name))
    found.discard(os.getpid())
    return sorted(p for p in found if procs.alive(p))


def leftovers(state: RunState) -> list[str]:
    """What of the run still exists (empty: nothing)."""
    out = [f"process {p}: {' '.join(procs.argv(p))[:120]}" for p in _processes(state)]
    namespaces = set(sh("ip", "netns", "list", check=False).stdout.split())
    out += [f"network namespace {n}" for n in state.namespaces if n in namespaces]
    links = sh("ip", "-o", "link", "show", check=False).stdout
    out += [f"link {name}" for name in state.links if f" {name}:" in links or f" {name}@" in links]
    mounts = Path("/proc/self/mounts").read_text()
    out += [f"mount {line.split()[1]}" for line in mounts.splitlines() if state.directory in line]
    if Path(state.directory).exists():
        out.append(f"directory {state.directory}")
    return out


def clean(state: RunState, hosts: list[Host] | None = None) -> list[str]:
    """Remove everything ``state`` records; what is left afterwards (empty: all gone)."""
    for host in hosts or []:
        if host.holder:
            host.run("umount", "-l", state.directory + "/shared", check=False, timeout=10)
    targets = _processes(state)
    for p in targets:
        procs.kill(p, signal.SIGCONT)
        procs.kill(p, signal.SIGKILL)
    procs.wait_gone(targets, 15)
    holders = [who[0] for who in state.holders.values() if procs.same(who)]
    for p in holders:
        procs.kill(p, signal.SIGKILL)
    procs.wait_gone(holders, 10)
    for ns in state.namespaces:
        sh("ip", "netns", "del", ns, check=False)
    for link in reversed(state.links):
        sh("ip", "link", "del", link, check=False)
    for line in Path("/proc/self/mounts").read_text().splitlines():  # nothing of ours should be in the root's
        if state.directory in line:
            sh("umount", "-l", line.split()[1], check=False)
    shutil.rmtree(state.directory, ignore_errors=True)
    left = leftovers(state)
    if not left:
        state.path.unlink(missing_ok=True)
    return left


def clean_leftovers(*, all_runs: bool = False) -> dict[str, list[str]]:
    """Clean every run whose owner process is gone (every run with ``all_runs``); run -> what is left."""
    out = {}
    for state in runs():
        if all_runs or not state.owner_alive():
            out[state.run] = clean(state)
    return out
