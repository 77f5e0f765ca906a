"""The one write the dashboard allows (cancelling a job) needs a token: configured from an
environment variable when the server starts (never logged, never echoed) and carried by the
request as ``Authorization: Bearer TOKEN``. With no token configured the dashboard is
read-only and says how to enable it."""

from __future__ import annotations

import hmac

from starlette.requests import Request

from .errors import ApiError

__all__ = ["check_token"]


def check_token(request: Request) -> None:
    """Raises ApiError 403 (no token configured) or 401 (none sent, or not the one)."""
    token: str | None = request.app.state.token
    env: str = request.app.state.token_env
    if not token:
        raise ApiError(
            403,
            f"the dashboard is read-only: to cancel jobs from it, start it with a token in an "
            f"environment variable (export {env}=...; sluice ui, or --token-env NAME) and send "
            "the token as Authorization: Bearer TOKEN",
        )
    scheme, _, sent = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not sent.strip():
        raise ApiError(
            401,
            f"cancelling needs the dashboard's token (the value of ${env} where `sluice ui` runs) "
            "as Authorization: Bearer TOKEN",
            {"WWW-Authenticate": "Bearer"},
        )
    if not hmac.compare_digest(sent.strip().encode(), token.encode()):
        raise ApiError(
            401,
            f"the token sent is not the dashboard's (the value of ${env} where `sluice ui` runs)",
            {"WWW-Authenticate": 'Bearer error="invalid_token"'},
        )
