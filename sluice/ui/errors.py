"""Errors as the dashboard answers them: JSON ``{"error": message}`` with the status the
kind of error means (a job that is not there: 404, a bad ``?at=``: 400, Redis down: 503)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sluice.errors import (
    ApiError,
    BadMoment,
    ConfigError,
    JobNotFound,
    RedisUnavailable,
    SluiceError,
    StateNotRegistered,
    StateServerUnavailable,
    UnknownStateName,
)

__all__ = ["ApiError", "status_of", "error_response", "handle_sluice_error", "handle_bug"]


def status_of(exc: SluiceError) -> int:
    if isinstance(exc, ApiError):
        return exc.status
    if isinstance(exc, JobNotFound | UnknownStateName):
        return 404
    if isinstance(exc, StateNotRegistered | StateServerUnavailable | RedisUnavailable):
        return 503
    if isinstance(exc, BadMoment | ConfigError):
        return 400
    return 500


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


async def handle_sluice_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, SluiceError)
    return error_response(status_of(exc), str(exc), getattr(exc, "headers", None))


async def handle_bug(request: Request, exc: Exception) -> Response:
    """Anything else is a bug: said as JSON like every error (uvicorn logs the traceback)."""
    return error_response(
        500,
        f"the dashboard failed answering {request.url.path} ({type(exc).__name__}: {exc}): "
        "a bug in Sluice; the output of `sluice ui` has the traceback",
    )
