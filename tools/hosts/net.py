"""The network: one bridge in the root namespace (with an address there, so the harness reaches
every host), one network namespace per host joined to it by a veth pair, addresses from a
/24 of the benchmarking range 198.18.0.0/15 (RFC 2544). Nothing routes beyond the bridge:
hosts reach each other and the root namespace, never the outside.
"""

from __future__ import annotations

import ipaddress
import subprocess

from sluice.errors import SluiceError

__all__ = [
    "HostsError",
    "sh",
    "free_subnet",
    "make_bridge",
    "add_host",
    "set_link",
    "check_probability",
    "drop",
    "undrop",
]


class HostsError(SluiceError):
    """The hosts harness could not do something (the command and its output are in the message)."""


def sh(*cmd: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise HostsError(f"`{' '.join(cmd)}` failed ({done.returncode}): {(done.stderr or done.stdout).strip()[:500]}")
    return done


def free_subnet() -> ipaddress.IPv4Network:
    """198.18.0.0/24, or the next /24 of 198.18.0.0/15 no interface of the root namespace uses
    (another run, or another user of the range, keeps its own)."""
    used = sh("ip", "-4", "-o", "addr", "show").stdout
    for i in range(512):
        net = ipaddress.IPv4Network(f"198.{18 + i // 256}.{i % 256}.0/24")
        if f" {net.network_address + 1}/" not in used:
            return net
    raise HostsError("every /24 of 198.18.0.0/15 is in use on this machine: run `scripts/hosts clean`")


def make_bridge(name: str, net: ipaddress.IPv4Network) -> str:
    """The bridge, with the subnet's first address in the root namespace; that address."""
    address = str(net.network_address + 1)
    sh("ip", "link", "add", name, "type", "bridge")
    sh("ip", "addr", "add", f"{address}/{net.prefixlen}", "dev", name)
    sh("ip", "link", "set", name, "up")
    return address


def add_host(namespace: str, veth: str, bridge: str, address: str, prefixlen: int) -> None:
    """A network namespace with ``eth0`` (``address``) whose peer ``veth`` is on ``bridge``, and loopback up."""
    sh("ip", "netns", "add", namespace)
    sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", namespace)
    sh("ip", "link", "set", veth, "master", bridge, "up")
    sh("ip", "netns", "exec", namespace, "ip", "addr", "add", f"{address}/{prefixlen}", "dev", "eth0")
    sh("ip", "netns", "exec", namespace, "ip", "link", "set", "eth0", "up")
    sh("ip", "netns", "exec", namespace, "ip", "link", "set", "lo", "up")


def set_link(veth: str, up: bool) -> None:
    """Cut (``up=False``) or restore a host's link: its root-side veth, so both directions go."""
    sh("ip", "link", "set", veth, "up" if up else "down")


def _rules(probability: float) -> list[list[str]]:
    match = ["-i", "eth0", "-m", "statistic", "--mode", "random", "--probability", f"{probability:.4f}", "-j", "DROP"]
    out = ["-o", "eth0", *match[2:]]
    return [["INPUT", *match], ["OUTPUT", *out]]


def check_probability(probability: float) -> None:
    if not 0.0 < probability <= 1.0:
        raise HostsError(f"drop probability {probability!r} is not in (0, 1]: give e.g. 0.2 for 20%")


def drop(namespace: str, probability: float) -> None:
    """Drop packets in and out of the host's ``eth0`` at random with ``probability`` (iptables
    inside the host's namespace: the rules go with the namespace)."""
    check_probability(probability)
    for chain, *rule in _rules(probability):
        sh("ip", "netns", "exec", namespace, "iptables", "-A", chain, *rule)


def undrop(namespace: str) -> None:
    """Remove the rules ``drop`` added (all of them: each chain is flushed of its DROP statistic rules)."""
    for chain in ("INPUT", "OUTPUT"):
        sh("ip", "netns", "exec", namespace, "iptables", "-F", chain, check=False)
