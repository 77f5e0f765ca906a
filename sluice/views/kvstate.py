"""A job's KvStateLocation table at a moment (``sluice inspect kvstate``, the dashboard):
one row per queryable state registration name, as the projector's ``kvstate`` table has it::

    [{"job_id", "name", "vertex", "num_key_groups", "registered_key_groups",
      "ranges": [{"start", "end", "state_id", "address", "execution_id"}]}]

Key groups ``start..end`` are inclusive; ``address`` is the Redis server that holds the
state (``state_id`` names its hash there), ``execution_id`` the attempt that registered it.
"""

from __future__ import annotations

from sluice.services.kvstate.registry import location_row
from sluice.store import EventLog

from .history import Moment, job_at
from .jobs import require_job

__all__ = ["kvstate"]


def kvstate(log: EventLog, job_id: str, at: Moment = Moment(None)) -> list[dict]:
    """Rows sorted by registration name. Raises JobNotFound for a job the log never had."""
    require_job(log, job_id)
    table = job_at(log, job_id, at).kvstate
    return [location_row(loc) for _, loc in sorted(table.locations.items())]
