"""Faults a chaos campaign inflicts on a ``HostsCluster``; each has its undo, and ``heal``
undoes them all. Nothing here waits for the cluster to notice: the campaign does."""

from __future__ import annotations

import signal

from tools.chaos import procs

from . import net
from .cluster import HostsCluster
from .host import Host
from .net import HostsError

__all__ = [
    "cut",
    "restore",
    "drop",
    "undrop",
    "latency",
    "no_latency",
    "kill_host",
    "restart_host",
    "freeze",
    "thaw",
    "skew",
    "heal",
]


def _host(cluster: HostsCluster, name: str) -> Host:
    if name not in cluster.hosts:
        raise HostsError(
            f"no host {name!r} in run {cluster.run}: its hosts are {', '.join(cluster.hosts) or 'none (not up)'}"
        )
    return cluster.hosts[name]


def cut(cluster: HostsCluster, host: str) -> None:
    """Take ``host``'s link down: it reaches nobody and nobody reaches it."""
    net.set_link(_host(cluster, host).veth, up=False)


def restore(cluster: HostsCluster, host: str) -> None:
    net.set_link(_host(cluster, host).veth, up=True)


def drop(cluster: HostsCluster, host: str, probability: float) -> None:
    """Drop packets in and out of ``host`` at random (``probability`` in (0, 1])."""
    net.check_probability(probability)
    net.drop(_host(cluster, host).namespace, probability)


def undrop(cluster: HostsCluster, host: str) -> None:
    net.undrop(_host(cluster, host).namespace)


def latency(cluster: HostsCluster, host: str, low_ms: int, high_ms: int) -> None:
    """Hold every chunk between ``host`` and Redis ``low_ms``..``high_ms`` each way. The host
    must have been laid out with a proxy (``Layout(proxied=(host,))``)."""
    if host not in cluster.layout.proxied:
        raise HostsError(f"host {host} has no delay proxy: lay the cluster out with Layout(proxied=({host!r},))")
    if not 0 <= low_ms <= high_ms:
        raise HostsError(f"latency {low_ms}..{high_ms} ms: give 0 <= low <= high, e.g. 50..200")
    (_host(cluster, host).directory / "delay").write_text(f"{low_ms} {high_ms}\n")


def no_latency(cluster: HostsCluster, host: str) -> None:
    (_host(cluster, host).directory / "delay").write_text("0 0\n")


def kill_host(cluster: HostsCluster, host: str, *, storage: bool = False) -> list[int]:
    """kill -9 every process of ``host`` (its Sluice processes, workers, Spark server, proxy),
    but its storage mount unless ``storage``; the pids killed."""
    keep = [] if storage else [p.pid for n, p in cluster.popen.items() if n == f"weed-mount-{host}"]
    return _host(cluster, host).kill_all(signal.SIGKILL, keep=keep)


def restart_host(cluster: HostsCluster, host: str) -> None:
    """Start ``host``'s Sluice processes again (after ``kill_host``), with its clock as now set."""
    cluster.start_roles(host)


def skew(cluster: HostsCluster, host: str, offset: str | None) -> None:
    """Run ``host``'s processes from now on with the wall clock off by ``offset`` (faketime's
    ``+30s``, ``-30s``; None: the true clock), monotonic clocks untouched: kills and restarts them."""
    if offset is not None and (not offset or offset[0] not in "+-"):
        raise HostsError(f"clock offset {offset!r}: give a signed faketime offset such as '+30s' or '-30s'")
    kill_host(cluster, host)
    _host(cluster, host).clock_offset = offset
    restart_host(cluster, host)


def freeze(pid: int) -> None:
    """SIGSTOP one process."""
    if not procs.kill(pid, signal.SIGSTOP):
        raise HostsError(f"process {pid} is gone: nothing to freeze")


def thaw(pid: int) -> None:
    procs.kill(pid, signal.SIGCONT)


def heal(cluster: HostsCluster) -> None:
    """Links up, no drops, no latency, every process of every host running (SIGCONT)."""
    for name, host in cluster.hosts.items():
        net.set_link(host.veth, up=True)
        net.undrop(host.namespace)
        if name in cluster.layout.proxied:
            no_latency(cluster, name)
        for p in host.pids():
            procs.kill(p, signal.SIGCONT)
