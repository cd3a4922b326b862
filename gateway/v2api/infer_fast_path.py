"""The inference routes, served past FastAPI's per-call machinery (`InferFastPath`, first in
`GatewayApp`'s stack), each with its own permission dependency, endpoint and the app's exception
handlers. A route that grows another dependency or parameter is refused when the app is built.
Why and what it saved: docs/benchmarks.md ("The gateway's fast path and settled heap (commit
2bdb4e0, demo --keep, 250 calls/s)").
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from tidegate.core.errors import ConfigurationError

__all__ = ["FAST_PATHS", "GatewayApp", "InferFastPath"]

FAST_PATHS = ("/v2/models/{model}/infer", "/v2/models/{model}/versions/{version}/infer")
"""The routes served by the fast path (POST only)."""

Endpoint = Callable[..., Awaitable[Response]]
Dependency = Callable[[Request], Awaitable[Any]]
Handler = Callable[[Request, Any], Response | Awaitable[Response]]


@dataclass(frozen=True)
class _FastRoute:
    path: re.Pattern[str]
    guard: Dependency
    endpoint: Endpoint


def _fast_route(route: APIRoute) -> _FastRoute:
    """The route's pieces, once it is certain FastAPI would call nothing else."""
    dependant = route.dependant
    guards = [dep.call for dep in dependant.dependencies if hasattr(dep.call, "permission")]
    extras = (
        dependant.query_params
        + dependant.header_params
        + dependant.cookie_params
        + dependant.body_params
    )
    params = list(inspect.signature(route.endpoint).parameters)
    wanted = ["request", *route.param_convertors]
    if len(guards) != 1 or len(dependant.dependencies) != 1 or extras or params != wanted:
        raise ConfigurationError(
            f"{route.path} cannot take the fast path: it needs one permission dependency and "
            f"the parameters {wanted}, and has {params} with "
            f"{len(dependant.dependencies)} dependencies"
        )
    if any(type(c).__name__ != "StringConvertor" for c in route.param_convertors.values()):
        raise ConfigurationError(f"{route.path} cannot take the fast path: typed path params")
    guard = guards[0]
    if guard is None:  # pragma: no cover (hasattr above)
        raise ConfigurationError(f"{route.path} has no permission dependency")
    return _FastRoute(route.path_regex, guard, route.endpoint)


class InferFastPath:
    """ASGI: the infer routes of `app` served directly, everything else by `inner`."""

    def __init__(self, inner: ASGIApp, app: FastAPI) -> None:
        self.inner = inner
        self._app = app
        self._routes = [
            _fast_route(route)
            for route in app.routes
            if isinstance(route, APIRoute) and route.path in FAST_PATHS and "POST" in route.methods
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            path = scope["path"]
            for route in self._routes:
                match = route.path.match(path)
                if match is not None:
                    await self._serve(route, match.groupdict(), scope, receive, send)
                    return
        await self.inner(scope, receive, send)

    async def _serve(
        self, route: _FastRoute, params: dict[str, str], scope: Scope, receive: Receive, send: Send
    ) -> None:
        scope["path_params"] = params
        request = Request(scope, receive, send)
        try:
            await route.guard(request)
            response = await route.endpoint(request, **params)
        except Exception as exc:  # answered as the app's handlers answer it
            answered = self._handler(exc)(request, exc)
            response = await answered if inspect.isawaitable(answered) else answered
        await response(scope, receive, send)

    def _handler(self, exc: Exception) -> Handler:
        handlers = self._app.exception_handlers
        for cls in type(exc).__mro__:
            handler = handlers.get(cls)
            if handler is not None:
                return handler
        raise exc


class GatewayApp(FastAPI):
    """The gateway's FastAPI app, with the infer routes on the fast path."""

    def build_middleware_stack(self) -> ASGIApp:
        return InferFastPath(super().build_middleware_stack(), self)
