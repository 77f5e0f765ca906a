"""The OpenAPI document of the JSON endpoints (``/api/openapi.json``), built from the routes
themselves: each handler's docstring gives its summary and description, its path its path
parameters, and ``@query`` its query parameters. (No YAML in docstrings: Sluice does not
depend on PyYAML.)"""

from __future__ import annotations

import inspect
import re
from typing import Any

from starlette.routing import BaseRoute
from starlette.schemas import BaseSchemaGenerator

from sluice import __version__

__all__ = ["OpenApi"]

_PATH_PARAM = re.compile(r"{(\w+)}")


class OpenApi(BaseSchemaGenerator):
    def get_schema(self, routes: list[BaseRoute]) -> dict[str, Any]:
        paths: dict[str, dict[str, Any]] = {}
        for ep in self.get_endpoints(routes):
            if not ep.path.startswith("/api/") or ep.path == "/api/openapi.json":
                continue
            doc = inspect.getdoc(ep.func) or ""
            summary, _, rest = doc.partition("\n")
            params: list[dict[str, Any]] = [
                {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                for name in _PATH_PARAM.findall(ep.path)
            ]
            params += [
                {"name": name, "in": "query", "required": False, "description": text, "schema": {"type": "string"}}
                for name, text in getattr(ep.func, "query_params", {}).items()
            ]
            responses: dict[str, Any] = {"200": {"description": "the view as JSON"}}
            if ep.path.endswith("/events"):
                responses = {
                    "200": {
                        "description": "server-sent events",
                        "content": {"text/event-stream": {"schema": {"type": "string"}}},
                    }
                }
            elif ep.http_method == "post":
                responses = {
                    "202": {"description": "accepted"},
                    "401": {"description": "no token sent, or not the dashboard's"},
                    "403": {"description": "the dashboard is read-only (no token configured)"},
                    "409": {"description": "the job has ended already"},
                }
            if "{job_id}" in ep.path:
                responses["404"] = {"description": "no such job (the error says where the jobs are listed)"}
            if any(p["name"] == "at" for p in params):
                responses["400"] = {"description": "?at= is not an entry id, milliseconds or an ISO time"}
            operation: dict[str, Any] = {
                "summary": summary.strip(),
                "parameters": params,
                "responses": responses,
                "operationId": getattr(ep.func, "__name__", ep.path),
            }
            if rest.strip():
                operation["description"] = " ".join(rest.split())
            paths.setdefault(ep.path, {})[ep.http_method] = operation
        return {
            "openapi": "3.0.3",
            "info": {
                "title": "Sluice dashboard",
                "version": __version__,
                "description": "Read-only views of the cluster and its jobs, folded from the log at any "
                "moment (?at=); cancelling needs the dashboard's token.",
            },
            "paths": paths,
        }
