"""The queryable-state lookup box's endpoint: the same lookup as ``sluice state get``
(``sluice.state.StateClient``), answered as the JSON ``sluice state get --json`` prints."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .errors import ApiError
from .params import log_of, query

__all__ = ["routes"]


@query(type="The key column's type: string (default) or long (an integer key: its key group differs).")
def state_lookup(request: Request) -> Response:
    """One key's queryable state, as ``sluice state get JOB NAME KEY --json`` prints it: the value (null
    when the key has none) and where it was found (key group, vertex, state id, server)."""
    from sluice.state import StateClient

    p = request.path_params
    kind = request.query_params.get("type", "string")
    key: object = p["key"]
    if kind == "long":
        try:
            key = int(p["key"])
        except ValueError:
            raise ApiError(400, f"type=long needs an integer key, got {p['key']!r}") from None
    elif kind != "string":
        raise ApiError(400, f"type={kind!r} is not a key type: use type=string or type=long")
    found = StateClient(log_of(request)).lookup(p["job_id"], p["name"], key)
    return JSONResponse(
        {
            "job_id": found.job_id,
            "name": found.name,
            "key": found.key,
            "key_group": found.key_group,
            "vertex": found.vertex,
            "state_id": found.state_id,
            "address": found.address,
            "value": found.value,
        }
    )


def routes() -> list[Route]:
    return [Route("/api/state/{job_id}/{name}/{key}", state_lookup)]
