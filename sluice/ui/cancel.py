"""Cancelling a job from the dashboard: the one write it allows, behind the token
(``auth``), through the same client code as ``sluice cancel``."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .auth import check_token
from .errors import ApiError
from .params import known_job, log_of

__all__ = ["routes"]


def cancel_job(request: Request) -> Response:
    """Cancel a job (every task is cancelled). Needs the dashboard's token: `sluice ui` started with
    the token in $SLUICE_UI_TOKEN (or --token-env NAME) and the request carrying Authorization: Bearer
    TOKEN. Answers 202 once the CancelJob is in the job's inbox."""
    from sluice.client import Client
    from sluice.services.jobs.state import TERMINAL_JOB

    check_token(request)
    log = log_of(request)
    job_id = known_job(log, request.path_params["job_id"])
    client = Client(log)
    status = client.job(job_id).status
    if status in TERMINAL_JOB:
        raise ApiError(409, f"job {job_id} is {status.value} already: there is nothing to cancel")
    client.cancel(job_id, "cancelled from the dashboard")
    return JSONResponse({"job_id": job_id, "cancel": "requested", "status": status.value}, status_code=202)


def routes() -> list[Route]:
    return [Route("/api/jobs/{job_id}/cancel", cancel_job, methods=["POST"])]
