"""The gateway's OpenAPI document (`tidegate.gateway.openapi.openapi_docs`): every operation
documents its error statuses as problems, auth statuses follow the declared permission, and the
schemas are the shapes the code really writes (a rendered problem, a V2 response and metadata
validate against them). The live check of every operation against the document is schemathesis's, in
tests/integration/gateway/test_openapi_conformance.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from fastapi import APIRouter, FastAPI
from fastapi.testclient import TestClient

from tests.unit.gateway_harness import Harness, features
from tidegate.core.errors import ConcurrencyConflictError, ModelNotFoundError
from tidegate.gateway.app import create_app
from tidegate.gateway.auth.authn import Authenticator
from tidegate.gateway.auth.identity import Identity, grants_of
from tidegate.gateway.gateway_services import GatewayConfig
from tidegate.gateway.openapi.openapi_docs import PERMISSION_KEY, install_openapi
from tidegate.gateway.problems import PROBLEM_JSON, error_problem
from tidegate.lifecycle.operations.commands import LifecycleCommands

# Every call is an admin: these tests are about the document, not about who may call.
ADMIN = Identity("local:openapi-test", "local", grants_of(["admin"]))


@asynccontextmanager
async def _no_commands(_config: GatewayConfig) -> AsyncIterator[LifecycleCommands]:
    raise AssertionError("the document is built without starting the app")
    yield  # pragma: no cover


@pytest.fixture
def openapi(tmp_path: Path) -> dict[str, Any]:
    h = Harness(tmp_path)
    app = create_app(
        h.config,
        lambda _c: h.services,
        admin=_no_commands,
        authenticator=Authenticator.fixed(ADMIN),
    )
    # Served without the lifespan: building the document starts nothing.
    served: dict[str, Any] = TestClient(app).get("/openapi.json").json()
    return served


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    h = Harness(tmp_path)
    app = create_app(h.config, lambda _c: h.services, authenticator=Authenticator.fixed(ADMIN))
    with TestClient(app) as http:
        yield http


def operations(openapi: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(m, p, op) for p, item in openapi["paths"].items() for m, op in item.items()]


def validates(openapi: dict[str, Any], schema: dict[str, Any], instance: Any) -> None:
    jsonschema.validate(instance, {**schema, "components": openapi["components"]})


def test_every_error_status_is_a_problem_and_no_fastapi_422_is_left(
    openapi: dict[str, Any],
) -> None:
    ops = operations(openapi)
    assert len(ops) > 30  # V2, /admin and /admin/dlq
    for method, path, op in ops:
        for status, response in op["responses"].items():
            if int(status) < 400:
                continue
            (media,) = response["content"]
            assert media == PROBLEM_JSON, (method, path, status)
            schema = response["content"][media]["schema"]
            assert schema["allOf"][0] == {"$ref": "#/components/schemas/Problem"}
            assert schema["allOf"][1]["properties"]["status"] == {"const": int(status)}
    assert "HTTPValidationError" not in openapi["components"]["schemas"]
    assert "HTTPValidationError" not in str(openapi)


def test_statuses_follow_the_route_kind(openapi: dict[str, Any]) -> None:
    def statuses(method: str, path: str) -> set[str]:
        return set(openapi["paths"][path][method]["responses"])

    infer = statuses("post", "/v2/models/{model}/infer")
    assert {"200", "202", "400", "404", "413", "415", "429", "500", "503", "504"} <= infer
    assert "422" not in infer  # a request that does not bind is a 400 problem here
    assert statuses("get", "/v2/health/live") == {"200"}
    assert statuses("get", "/v2/health/ready") == {"200", "503"}
    promote = statuses("post", "/admin/models/{name}/promote")
    assert {"400", "404", "409", "422", "503"} <= promote
    assert {"200", "201"} <= statuses("post", "/admin/models/{name}/versions")
    assert {"200", "202", "422"} <= statuses("post", "/admin/dlq/redrive")
    assert "409" not in statuses("get", "/admin/models/{name}")
    retry = openapi["paths"]["/v2/models/{model}/infer"]["post"]["responses"]["429"]
    assert retry["headers"]["Retry-After"]["required"] is True


def test_auth_statuses_follow_the_declared_permission(openapi: dict[str, Any]) -> None:
    for _method, path, op in operations(openapi):
        public = op[PERMISSION_KEY] == "public"
        assert ({"401", "403"} <= set(op["responses"])) is not public, path
        if path.startswith("/v2/health/") or path == "/metrics":
            assert public, path
        if path.startswith("/admin/") or path.endswith("/infer"):
            assert not public, path

    router = APIRouter()

    @router.get("/admin/open", openapi_extra={PERMISSION_KEY: "public"})
    async def open_read() -> dict[str, str]:
        return {}

    @router.post("/v2/health/deploy", openapi_extra={PERMISSION_KEY: "deploy"})
    async def guarded() -> dict[str, str]:
        return {}

    app = FastAPI()
    app.include_router(router)
    install_openapi(app)
    paths = app.openapi()["paths"]
    assert not {"401", "403"} & set(paths["/admin/open"]["get"]["responses"])
    assert {"401", "403"} <= set(paths["/v2/health/deploy"]["post"]["responses"])


def test_a_rendered_problem_matches_the_problem_schema(openapi: dict[str, Any]) -> None:
    response = openapi["paths"]["/admin/models/{name}/promote"]["post"]["responses"]
    for status, error in (
        ("404", ModelNotFoundError("no model")),
        ("409", ConcurrencyConflictError("fraud", 3, 4)),
    ):
        body = json.loads(bytes(error_problem(error, instance="/admin/models/x/promote").body))
        schema = response[status]["content"][PROBLEM_JSON]["schema"]
        validates(openapi, schema, body)
        # The schema pins the status: a body that says another one does not pass.
        wrong = {**body, "status": 500}
        with pytest.raises(jsonschema.ValidationError):
            validates(openapi, schema, wrong)


def test_success_bodies_match_what_the_routes_answer(
    openapi: dict[str, Any], client: TestClient
) -> None:
    def ok_schema(method: str, path: str, status: str = "200") -> dict[str, Any]:
        schema: dict[str, Any] = openapi["paths"][path][method]["responses"][status]["content"][
            "application/json"
        ]["schema"]
        return schema

    answered = client.post("/v2/models/fraud/infer", json=features())
    validates(openapi, ok_schema("post", "/v2/models/{model}/infer"), answered.json())
    pending = client.post(
        "/v2/models/fraud/infer", json=features(), headers={"Prefer": "respond-async"}
    )
    assert pending.status_code == 202
    validates(openapi, ok_schema("post", "/v2/models/{model}/infer", "202"), pending.json())
    validates(
        openapi, ok_schema("get", "/v2/models/{model}"), client.get("/v2/models/fraud").json()
    )
    validates(openapi, ok_schema("get", "/v2"), client.get("/v2").json())
    validates(
        openapi,
        ok_schema("get", "/v2/models/{model}/ready"),
        client.get("/v2/models/fraud/ready").json(),
    )
    validates(openapi, ok_schema("get", "/v2/health/ready"), client.get("/v2/health/ready").json())
    with pytest.raises(jsonschema.ValidationError):
        validates(openapi, ok_schema("get", "/v2/models/{model}"), client.get("/v2").json())
