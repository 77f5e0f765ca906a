"""The dashboard's Starlette app: the JSON endpoints (``api``), the job pages' event streams
(``live``), the OpenAPI document, and the pages: one HTML shell that the package's own
script fills in for every page path (``/``, ``/jobs/{id}``, ``/taskmanagers``, ``/streams``,
``/state``). Everything it serves comes from the package; nothing from a CDN."""

from __future__ import annotations

import threading
from importlib.resources import files

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from sluice.errors import SluiceError
from sluice.store import EventLog

from . import api, cancel, live, state
from .errors import error_response, handle_bug, handle_sluice_error
from .openapi import OpenApi

__all__ = ["create_app", "PAGES"]

PAGES = ("/", "/jobs/{job_id}", "/taskmanagers", "/streams", "/state")


def _shell() -> str:
    return (files("sluice.ui") / "static" / "index.html").read_text(encoding="utf-8")


async def page(request: Request) -> Response:
    return HTMLResponse(request.app.state.shell, headers={"Cache-Control": "no-cache"})


async def openapi(request: Request) -> Response:
    return JSONResponse(request.app.state.openapi)


async def not_found(request: Request, exc: Exception) -> Response:
    return error_response(
        404,
        f"nothing at {request.url.path}: the pages are {', '.join(PAGES)}; the JSON "
        "endpoints are listed in /api/openapi.json",
    )


def create_app(log: EventLog, *, token: str | None = None, token_env: str = "SLUICE_UI_TOKEN") -> Starlette:
    """The dashboard over ``log``. ``token``: what a cancel request must carry (None: read-only);
    ``token_env``: the variable it came from, for messages (the token itself is never shown)."""
    routes: list[BaseRoute] = [
        *api.routes(),
        *cancel.routes(),
        *state.routes(),
        Route("/api/jobs/{job_id}/events", live.job_events),
        Route("/api/events", live.cluster_events),
        Route("/api/openapi.json", openapi, include_in_schema=False),
        Mount("/static", StaticFiles(packages=[("sluice.ui", "static")]), name="static"),
        *(Route(path, page, include_in_schema=False) for path in PAGES),
    ]
    app = Starlette(
        routes=routes, exception_handlers={SluiceError: handle_sluice_error, 404: not_found, Exception: handle_bug}
    )
    app.state.log = log
    app.state.token = token or None
    app.state.token_env = token_env
    app.state.stopping = threading.Event()
    app.state.shell = _shell()
    app.state.openapi = OpenApi().get_schema(routes)
    return app
