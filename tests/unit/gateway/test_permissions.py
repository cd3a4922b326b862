"""Every route of the gateway declares and enforces a permission
(tidegate.gateway.auth.permissions): the walk of the app's routes and of its OpenAPI, the permission
table of docs/security.md, and what callers get: 401 with a challenge, 403, the rate limiter after
authorization, the audit trail, and the lifecycle's actor from the identity rather than a header."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from tests.unit.auth_fixtures import MemoryKeyStore, bearer
from tests.unit.gateway_harness import Harness, features, problem_of
from tidegate.clients.audit import MemoryAuditTrail
from tidegate.core.errors import InvalidTransitionError, RateLimitedError
from tidegate.gateway import http_metrics
from tidegate.gateway.admin.lifecycle_api import install_admin, lifecycle_admin
from tidegate.gateway.app import create_app
from tidegate.gateway.auth.auth_settings import AuthSettings
from tidegate.gateway.auth.authn import Authenticator
from tidegate.gateway.auth.identity import Grant, Identity, Permission
from tidegate.gateway.auth.key_verifier import KeyVerifier
from tidegate.gateway.auth.permissions import PERMISSION_KEY, route_permission
from tidegate.gateway.v2api.routes import INSECURE_HEADER

P = Permission
TABLE: dict[tuple[str, str], Permission] = {
    ("POST", "/v2/models/{model}/infer"): P.INFER,
    ("POST", "/v2/models/{model}/versions/{version}/infer"): P.INFER,
    ("GET", "/v2/health/live"): P.PUBLIC,
    ("GET", "/v2/health/ready"): P.PUBLIC,
    ("GET", "/v2"): P.READ,
    ("GET", "/v2/models/{model}"): P.READ,
    ("GET", "/v2/models/{model}/versions/{version}"): P.READ,
    ("GET", "/v2/models/{model}/ready"): P.READ,
    ("GET", "/v2/models/{model}/versions/{version}/ready"): P.READ,
    ("GET", "/v2/requests/{request_id}"): P.INFER,
    ("GET", "/metrics"): P.PUBLIC,
    ("GET", "/admin/models"): P.READ,
    ("GET", "/admin/models/{name}"): P.READ,
    ("GET", "/admin/models/{name}/history"): P.READ,
    ("GET", "/admin/models/{name}/state"): P.READ,
    ("GET", "/admin/models/{name}/compare"): P.READ,
    ("GET", "/admin/requests/{request_id}/served"): P.READ,
    ("POST", "/admin/models/{name}/versions"): P.DEPLOY,
    ("POST", "/admin/models/{name}/shadow"): P.DEPLOY,
    ("POST", "/admin/models/{name}/canary"): P.DEPLOY,
    ("POST", "/admin/models/{name}/promote"): P.DEPLOY,
    ("POST", "/admin/models/{name}/rollback"): P.DEPLOY,
    ("POST", "/admin/models/{name}/pin"): P.DEPLOY,
    ("POST", "/admin/models/{name}/unpin"): P.DEPLOY,
    ("POST", "/admin/models/{name}/experiment"): P.DEPLOY,
    ("POST", "/admin/models/{name}/fallback"): P.DEPLOY,
    ("POST", "/admin/models/{name}/pool"): P.DEPLOY,
    ("POST", "/admin/models/{name}/retire"): P.ADMIN,
    ("GET", "/admin/dlq/messages"): P.ADMIN,
    ("GET", "/admin/dlq/messages/{topic}/{partition}/{offset}"): P.ADMIN,
    ("GET", "/admin/dlq/stats"): P.ADMIN,
    ("POST", "/admin/dlq/redrive"): P.ADMIN,
    ("GET", "/admin/dlq/redrive"): P.ADMIN,
    ("GET", "/admin/dlq/redrive/{run_id}"): P.ADMIN,
    ("DELETE", "/admin/dlq/redrive/{run_id}"): P.ADMIN,
}
# FastAPI's own pages: the document and its viewers, open like the document itself.
FASTAPI_PAGES = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}


def undeclared(app: FastAPI) -> list[str]:
    """Every route of `app` that does not both declare and enforce the same permission."""
    bad = []
    for route in app.routes:
        if not isinstance(route, APIRoute):
            if getattr(route, "path", None) not in FASTAPI_PAGES:
                bad.append(f"{getattr(route, 'path', route)} (not an API route)")
            continue
        declared, enforced = route_permission(route)
        if declared is None or enforced is None or declared is not enforced:
            bad.append(f"{route.path}: declares {declared}, enforces {enforced}")
    # FastAPI's own document, before tidegate.gateway.openapi.openapi_docs fills in what a route's
    # kind needs: what the routes themselves declare.
    raw = get_openapi(title=app.title, version=app.version, routes=app.routes)
    for path, operations in raw["paths"].items():
        for method, operation in operations.items():
            if PERMISSION_KEY not in operation:
                bad.append(f"{method.upper()} {path}: no {PERMISSION_KEY} in the OpenAPI")
    return bad


def served_app(harness: Harness) -> FastAPI:
    """The app `tidegate gateway` serves, /admin included (never started here: no database)."""
    return create_app(harness.config, lambda _c: harness.services, admin=lifecycle_admin)


def full_app(harness: Harness) -> FastAPI:
    """The same routes, /admin without its lifecycle commands (which answer 503 once a call is
    authorized), so the calls below reach no database."""
    app = create_app(
        harness.config, lambda _c: harness.services, authenticator=harness.authenticator
    )
    install_admin(app)
    return app


def operations(app: FastAPI) -> Iterator[tuple[str, str, APIRoute]]:
    for route in app.routes:
        if isinstance(route, APIRoute):
            for method in sorted(route.methods):
                yield method, route.path, route


def concrete(path: str) -> str:
    values = {"model": "fraud", "name": "fraud", "partition": "0", "offset": "0"}
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), "x"), path)


def test_every_route_declares_and_enforces_a_permission(tmp_path: Path) -> None:
    assert undeclared(served_app(Harness(tmp_path))) == []


def test_the_walk_catches_a_route_that_declares_none(tmp_path: Path) -> None:
    app = served_app(Harness(tmp_path))

    @app.get("/v2/forgotten")
    async def forgotten() -> dict[str, str]:
        return {}

    found = undeclared(app)
    assert "/v2/forgotten: declares None, enforces None" in found
    assert f"GET /v2/forgotten: no {PERMISSION_KEY} in the OpenAPI" in found


def test_the_permission_table(tmp_path: Path) -> None:
    app = served_app(Harness(tmp_path))
    found = {(m, p): route_permission(r)[1] for m, p, r in operations(app)}
    assert found == TABLE
    documented = {
        (method.upper(), path): Permission(op[PERMISSION_KEY])
        for path, ops in app.openapi()["paths"].items()
        for method, op in ops.items()
    }
    assert documented == TABLE


@pytest.fixture
def store() -> MemoryKeyStore:
    return MemoryKeyStore()


def key(store: MemoryKeyStore, *grants: Grant) -> dict[str, str]:
    issued = asyncio.run(store.create("t", grants, created_by="local:t"))
    return bearer(issued.key)


def secured(harness: Harness, store: MemoryKeyStore, **settings: Any) -> Harness:
    harness.authenticator = Authenticator(
        AuthSettings(**settings), keys=KeyVerifier(store, ttl_s=2.0)
    )
    return harness


def walk(http: TestClient, headers: dict[str, str], wanted: set[Permission]) -> dict[str, int]:
    statuses = {}
    for method, path, route in operations(http.app):  # type: ignore[arg-type]
        if route_permission(route)[1] in wanted:
            body: dict[str, Any] | None = {} if method == "POST" else None
            resp = http.request(method, concrete(path), headers=headers, json=body)
            statuses[f"{method} {path}"] = resp.status_code
    return statuses


def test_anonymous_callers_get_401_with_a_challenge_on_every_protected_route(
    tmp_path: Path, store: MemoryKeyStore
) -> None:
    harness = secured(Harness(tmp_path), store)
    with TestClient(full_app(harness)) as http:
        protected = {P.READ, P.INFER, P.DEPLOY, P.ADMIN}
        assert set(walk(http, {}, protected).values()) == {401}
        body = problem_of(http.post("/v2/models/fraud/infer", json=features()), 401)
        assert body["code"] == "UNAUTHENTICATED"
        resp = http.get("/admin/models", headers={"Authorization": "Basic dTpw"})
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
        assert problem_of(resp, 401)["detail"].startswith("use an `Authorization: Bearer")
        wrong = http.get("/v2", headers=bearer("tg_0123456789abcdef_" + "x" * 43))
        assert problem_of(wrong, 401)["detail"] == "invalid API key"
        assert "x" * 43 not in wrong.text
        # Health and metrics stay open.
        assert set(walk(http, {}, {P.PUBLIC}).values()) == {200}
        assert INSECURE_HEADER not in http.get("/v2/health/ready").headers
    assert harness.worker.published == []


def test_an_infer_key_gets_403_on_deploy_and_admin_routes(
    tmp_path: Path, store: MemoryKeyStore
) -> None:
    harness = secured(Harness(tmp_path), store)
    infer = key(store, Grant("infer"))
    with TestClient(full_app(harness)) as http:
        assert set(walk(http, infer, {P.DEPLOY, P.ADMIN}).values()) == {403}
        body = problem_of(http.post("/admin/models/fraud/promote", headers=infer, json={}), 403)
        assert body["code"] == "PERMISSION_DENIED"
        assert (
            http.post("/v2/models/fraud/infer", headers=infer, json=features()).status_code == 200
        )
        assert http.get("/v2/models/fraud", headers=infer).status_code == 200
        # /admin reads pass authorization (the lifecycle is not started here: 503).
        assert http.get("/admin/models", headers=infer).status_code == 503
        deploy = key(store, Grant("deploy"))
        assert http.post("/admin/models/fraud/retire", headers=deploy, json={}).status_code == 403
        assert http.post("/admin/models/fraud/pin", headers=deploy, json={}).status_code != 403


def test_a_key_scoped_to_one_model_may_not_call_another(
    tmp_path: Path, store: MemoryKeyStore
) -> None:
    harness = secured(Harness(tmp_path), store)
    fraud_only = key(store, Grant("infer", frozenset({"fraud"})))
    with TestClient(full_app(harness)) as http:
        assert (
            http.post("/v2/models/fraud/infer", headers=fraud_only, json=features()).status_code
            == 200
        )
        denied = http.post(
            "/v2/models/echo/infer",
            headers=fraud_only,
            json={"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}]},
        )
        assert "echo" in problem_of(denied, 403)["detail"]
        assert http.get("/v2/models/echo", headers=fraud_only).status_code == 403
    assert {r["model"] for r in harness.worker.published} == {"fraud"}


def test_a_fallback_needs_deploy_on_its_target_too(tmp_path: Path, store: MemoryKeyStore) -> None:
    harness = secured(Harness(tmp_path), store)
    fraud_only = key(store, Grant("deploy", frozenset({"fraud"})))
    both = key(store, Grant("deploy", frozenset({"fraud", "fraud-lite"})))
    route = "/admin/models/fraud/fallback"
    with TestClient(full_app(harness)) as http:
        denied = http.post(route, headers=fraud_only, json={"fallback": "fraud-lite"})
        assert "fraud-lite" in problem_of(denied, 403)["detail"]
        # Clearing it, or naming a model the key deploys on too, passes authorization (the
        # lifecycle is not started here: 503).
        assert http.post(route, headers=fraud_only, json={"fallback": None}).status_code == 503
        assert http.post(route, headers=both, json={"fallback": "fraud-lite"}).status_code == 503


def test_closed_health_and_metrics_need_read(tmp_path: Path, store: MemoryKeyStore) -> None:
    harness = secured(Harness(tmp_path), store, open_health=False, open_metrics=False)
    app = full_app(harness)
    with TestClient(app) as http:
        for path in ("/v2/health/live", "/v2/health/ready", "/metrics"):
            assert http.get(path).status_code == 401
            assert http.get(path, headers=key(store, Grant("infer"))).status_code == 200
    assert app.openapi()["paths"]["/metrics"]["get"][PERMISSION_KEY] == "read"


def test_insecure_lets_everyone_in_as_the_local_admin_and_says_so(tmp_path: Path) -> None:
    harness = Harness(tmp_path)  # AuthSettings(enabled=False): what --insecure sets
    with TestClient(full_app(harness)) as http:
        assert http.post("/v2/models/fraud/infer", json=features()).status_code == 200
        assert INSECURE_HEADER in http.get("/v2/health/ready").headers


class Limiter:
    def __init__(self) -> None:
        self.checked: list[tuple[str, str | None]] = []
        self.refuse = False

    async def check(
        self, identity: Identity, model: str | None = None, *, client: str | None = None
    ) -> None:
        self.checked.append((identity.subject, model))
        if self.refuse:
            raise RateLimitedError(2.5)


def test_infer_calls_are_rate_limited_after_authorization(
    tmp_path: Path, store: MemoryKeyStore
) -> None:
    harness = secured(Harness(tmp_path), store)
    app = full_app(harness)
    limiter = Limiter()
    infer = key(store, Grant("infer", frozenset({"fraud"})))
    with TestClient(app) as http:
        app.state.rate_limiter = limiter
        assert (
            http.post("/v2/models/fraud/infer", headers=infer, json=features()).status_code == 200
        )
        http.post("/v2/models/fraud/infer", json=features())  # 401: never counted
        http.get("/v2/models/echo/ready", headers=infer)  # 403, and not an infer route
        http.get("/v2/models/fraud", headers=infer)  # read: not limited
        [(subject, model)] = limiter.checked
        assert (subject.startswith("key:"), model) == (True, "fraud")
        limiter.refuse = True
        refused = http.post("/v2/models/fraud/infer", headers=infer, json=features())
        assert problem_of(refused, 429)["code"] == "RATE_LIMITED"
        assert refused.headers["Retry-After"] == "3"


class FakeCommands:
    """Records who each command acted as."""

    def __init__(self) -> None:
        self.actors: list[str] = []

    async def promote(self, name: str, version: str, *, actor: str, **_: Any) -> Any:
        self.actors.append(actor)
        if version == "bad":
            raise InvalidTransitionError("no such transition")

        class Result:
            def to_dict(self) -> dict[str, Any]:
                return {"promoted": version}

        return Result()


def test_the_actor_is_the_identity_whatever_x_tidegate_actor_says_and_is_audited(
    store: MemoryKeyStore,
) -> None:
    app = FastAPI()
    commands = FakeCommands()
    install_admin(app, commands)  # type: ignore[arg-type]
    app.state.authenticator = Authenticator(AuthSettings(), keys=KeyVerifier(store))
    app.state.audit = trail = MemoryAuditTrail()
    deployer = key(store, Grant("deploy"))
    with TestClient(app) as http:
        headers = {**deployer, "X-Tidegate-Actor": "security-team"}
        resp = http.post("/admin/models/fraud/promote", headers=headers, json={"version": "1"})
        assert resp.status_code == 200, resp.text
        http.post("/admin/models/fraud/promote", headers=deployer, json={"version": "bad"})
        http.post("/admin/models/fraud/promote", headers={"X-Tidegate-Actor": "x"}, json={})
        http.post("/admin/models/fraud/retire", headers=deployer, json={"version": "1"})
    subject = next(iter(store.rows))
    assert commands.actors == [f"key:{subject}", f"key:{subject}"]
    entries = [(e["action"], e["actor"], e["outcome"], e["target"]) for e in trail.events]
    assert entries == [
        ("lifecycle.promote", f"key:{subject}", "success", "fraud@1"),
        ("lifecycle.promote", f"key:{subject}", "failure", "fraud@bad"),
        ("auth.failed", "anonymous", "denied", "/admin/models/fraud/promote"),
        ("lifecycle.promote", "anonymous", "denied", "fraud"),
        ("auth.denied", f"key:{subject}", "denied", "/admin/models/fraud/retire"),
        ("lifecycle.retire", f"key:{subject}", "denied", "fraud@1"),
    ]
    failed = trail.events[2]
    assert failed["details"]["reason"] == "no credentials"
    assert failed["source"] == "testclient:50000"
    assert trail.events[4]["details"]["permission"] == "admin"
    assert all(deployer["Authorization"][7:] not in str(e) for e in trail.events)


def test_refusals_are_audited_at_a_bounded_rate_and_the_rest_counted(
    store: MemoryKeyStore,
) -> None:
    app = FastAPI()
    install_admin(app, FakeCommands())  # type: ignore[arg-type]
    app.state.authenticator = Authenticator(AuthSettings(), keys=KeyVerifier(store))
    app.state.audit = trail = MemoryAuditTrail()
    counters = [http_metrics.AUDIT_DROPPED.labels(a) for a in ("auth.failed", "lifecycle.promote")]
    before = sum(c._value.get() for c in counters)
    deployer = key(store, Grant("deploy"))
    with TestClient(app) as http:
        for _ in range(12):  # a flood of bogus keys, within one second
            bogus = {"Authorization": "Bearer tg_0000000000000000_" + "x" * 43}
            http.post("/admin/models/fraud/promote", headers=bogus, json={"version": "1"})
        ok = http.post("/admin/models/fraud/promote", headers=deployer, json={"version": "1"})
        assert ok.status_code == 200, ok.text
    actions = [(e["action"], e["outcome"]) for e in trail.events]
    # Each refused call is two refusal entries (the failed credentials, the denied action): 5 a
    # second from one client host are written, the other 19 counted.
    assert [outcome for _, outcome in actions].count("denied") == 5
    assert sum(c._value.get() for c in counters) - before == 19
    # An allowed admin action is always recorded, however many refusals came before it.
    assert actions[-1] == ("lifecycle.promote", "success")
