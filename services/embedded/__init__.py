"""The embedded cluster: a redis-server Sluice spawns itself, and local Sluice processes."""

from .redis_server import RedisServer, find_redis_server, free_port
from .supervisor import EmbeddedCluster

__all__ = ["RedisServer", "find_redis_server", "free_port", "EmbeddedCluster"]
