"""Sluice's events: data and codecs only, no I/O.

Every event class is declared once in this package with its schema version; importing
the package registers them all, so any entry of the log can be decoded.
"""

from .descriptor import *  # noqa: F401,F403
from .descriptor import __all__ as _descriptor
from .envelope import FIELD, Envelope, decode, decode_bytes, decode_fields, encode
from .fastdecode import decode_bytes_msgspec
from .jobgraph import *  # noqa: F401,F403
from .jobgraph import __all__ as _jobgraph
from .jobs import *  # noqa: F401,F403
from .jobs import __all__ as _jobs
from .kvstate import *  # noqa: F401,F403
from .kvstate import __all__ as _kvstate
from .membership import *  # noqa: F401,F403
from .membership import __all__ as _membership
from .schema import EVENT_TYPES, JSON, Event, event, record
from .speculation import *  # noqa: F401,F403
from .speculation import __all__ as _speculation
from .splits import *  # noqa: F401,F403
from .splits import __all__ as _splits
from .types import DEFAULT_MAX_PARALLELISM, PROTOCOL_VERSION, JobStatus, KeyGroupRange, TaskState
from .upcast import upcast, upcaster

__all__ = [
    "FIELD",
    "Envelope",
    "decode",
    "decode_bytes",
    "decode_bytes_msgspec",
    "decode_fields",
    "encode",
    "EVENT_TYPES",
    "JSON",
    "Event",
    "event",
    "record",
    "upcast",
    "upcaster",
    "DEFAULT_MAX_PARALLELISM",
    "PROTOCOL_VERSION",
    "JobStatus",
    "KeyGroupRange",
    "TaskState",
    *_membership,
    *_jobgraph,
    *_jobs,
    *_splits,
    *_kvstate,
    *_descriptor,
    *_speculation,
]
