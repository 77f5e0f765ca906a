"""What a harness asks each node of a Redis Cluster it runs (tools/redis_cluster.py: the
loopback cluster of the tests, benchmarks and chaos runs): store/ is the only package that
talks to Redis."""

from __future__ import annotations

from dataclasses import dataclass

import redis
from redis.crc import key_slot

from sluice.errors import RedisUnavailable

__all__ = ["NodeView", "node_view", "keyslot", "NodeError"]

NodeError = redis.RedisError
"""What a node's client raises when it cannot answer (harnesses catch it while a node is away)."""


@dataclass(frozen=True)
class NodeView:
    """One node's view of its cluster."""

    state: str
    """``cluster_state`` of CLUSTER INFO (``ok``, ``fail``)."""
    slots: tuple[tuple[int, int, int], ...]
    """(first slot, last slot, port of the master serving them), sorted."""
    role: str
    """``master`` or ``slave`` (INFO replication)."""
    link_up: bool
    """For a replica, whether its link to its master is up (its first sync done)."""


def node_view(port: int, host: str = "127.0.0.1", timeout: float = 1.0) -> NodeView:
    """What the node on ``port`` says of the cluster (RedisUnavailable when it does not
    answer, or not yet as a cluster node)."""
    client = redis.Redis(host=host, port=port, socket_timeout=timeout, socket_connect_timeout=timeout)
    try:
        state = str(client.cluster("info").get("cluster_state"))
        slots = tuple(sorted((int(s[0]), int(s[1]), int(s[2][1])) for s in client.execute_command("CLUSTER SLOTS")))
        replication = client.info("replication")
    except redis.RedisError as exc:
        raise RedisUnavailable(f"cluster node {host}:{port} does not answer: {exc}") from exc
    finally:
        client.close()
    role = str(replication.get("role"))
    return NodeView(state, slots, role, role != "slave" or replication.get("master_link_status") == "up")


def keyslot(key: str) -> int:
    """The hash slot of ``key`` (its hash tag's, when it has one), as CLUSTER KEYSLOT says."""
    return int(key_slot(key.encode()))
