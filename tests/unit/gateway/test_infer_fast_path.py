"""The infer routes served past FastAPI's per-call machinery
(`tidegate.gateway.v2api.infer_fast_path`): the same route's permission, endpoint and error
handlers, without the middleware stack, the route scan or dependency solving. What callers get is
tested by every other gateway test, which goes through it; these test that it is taken, and only
where it is equivalent."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import Depends, Request
from fastapi.responses import JSONResponse, Response
from fastapi.testclient import TestClient
from starlette.types import ASGIApp, Receive, Scope, Send

from tests.unit.gateway_harness import Harness, client, features, harness, problem_of
from tidegate.core.errors import ConfigurationError
from tidegate.gateway.auth.identity import Permission
from tidegate.gateway.auth.permissions import guarded
from tidegate.gateway.v2api import v2_http
from tidegate.gateway.v2api.infer_fast_path import GatewayApp, InferFastPath

__all__ = ["client", "harness"]


class _Seen:
    """The ordinary stack, recording what reaches it."""

    def __init__(self, inner: ASGIApp) -> None:
        self.inner = inner
        self.paths: list[tuple[str, str]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.paths.append((scope["method"], scope["path"]))
        await self.inner(scope, receive, send)


def _ordinary(client: TestClient) -> _Seen:
    client.get("/v2/health/live")  # builds the stack
    fast = client.app.middleware_stack  # type: ignore[attr-defined]
    assert isinstance(fast, InferFastPath)
    seen = _Seen(fast.inner)
    fast.inner = seen
    return seen


def test_infer_calls_take_the_fast_path_and_the_rest_the_ordinary_stack(
    client: TestClient,
) -> None:
    seen = _ordinary(client)
    assert client.post("/v2/models/fraud/infer", json=features()).status_code == 200
    assert client.post("/v2/models/fraud/versions/1/infer", json=features()).status_code == 200
    assert seen.paths == []
    assert client.get("/v2/health/live").status_code == 200
    # Not an infer call: a GET on the route's path is the ordinary stack's 405.
    problem_of(client.get("/v2/models/fraud/infer"), 405)
    problem_of(client.post("/v2/models/fraud/infer/more", json=features()), 404)
    assert seen.paths == [
        ("GET", "/v2/health/live"),
        ("GET", "/v2/models/fraud/infer"),
        ("POST", "/v2/models/fraud/infer/more"),
    ]


def test_an_unexpected_error_is_the_apps_500_problem(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*_args: Any) -> Response:
        raise RuntimeError("a bug")

    monkeypatch.setattr(v2_http, "infer", broken)
    body = problem_of(client.post("/v2/models/fraud/infer", json=features()), 500)
    assert body["code"] == "INTERNAL"
    assert body["instance"] == "/v2/models/fraud/infer"


def test_the_permission_is_the_routes_own(harness: Harness) -> None:
    denied: list[str] = []

    async def guard(request: Request) -> None:
        denied.append(request.path_params["model"])
        raise ConfigurationError("refused by the route's own dependency")

    guard.permission = Permission.INFER  # type: ignore[attr-defined]
    app = GatewayApp()

    @app.post("/v2/models/{model}/infer", dependencies=[Depends(guard)])
    async def infer(request: Request, model: str) -> Response:
        return JSONResponse({"model": model})

    @app.exception_handler(Exception)
    async def unexpected(_request: Request, exc: Exception) -> Response:
        return JSONResponse({"refused": str(exc)}, status_code=500)

    with TestClient(app, raise_server_exceptions=False) as http:
        resp = http.post("/v2/models/fraud/infer", json={})
    assert resp.json() == {"refused": "refused by the route's own dependency"}
    assert denied == ["fraud"]


def test_a_route_that_needs_more_than_its_permission_cannot_take_the_fast_path() -> None:
    app = GatewayApp()

    @app.post("/v2/models/{model}/infer", **guarded(Permission.INFER, model_from="model"))
    async def infer(request: Request, model: str, verbose: bool = False) -> Response:
        return JSONResponse({"verbose": verbose})

    with pytest.raises(ConfigurationError, match="cannot take the fast path"):
        app.build_middleware_stack()
