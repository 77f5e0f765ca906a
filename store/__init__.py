"""The only package that talks to Redis: keys, the event log, consumers, the lease,
outbox delivery and read-model tables."""

from .backend import Backend
from .blobs import Blobs
from .cluster_backend import ClusterBackend, open_backend
from .connection import connect, redact
from .consumer import Entry, GroupConsumer
from .keys import Keys, tag_of
from .kvstate import KvStates, server_address
from .lease import LeaderLease, LeaseHolder, current_leader
from .log import CommitResult, Consumed, EventLog, Out, entry_order
from .outbox import Deliverer
from .redis_backend import RedisBackend
from .snapshots import Snapshots, StoredSnapshot
from .tables import ReadModels

__all__ = [
    "Backend",
    "RedisBackend",
    "ClusterBackend",
    "open_backend",
    "Blobs",
    "connect",
    "redact",
    "Entry",
    "GroupConsumer",
    "Keys",
    "tag_of",
    "LeaderLease",
    "LeaseHolder",
    "current_leader",
    "CommitResult",
    "Consumed",
    "EventLog",
    "Out",
    "entry_order",
    "Deliverer",
    "ReadModels",
    "KvStates",
    "server_address",
    "Snapshots",
    "StoredSnapshot",
]
