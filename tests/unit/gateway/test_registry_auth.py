"""The schema registry refuses anonymous callers, and tells reading, registering and the changes
that can break every reader (deletes, compatibility) apart (docs/security.md). Credentials are
what confluent-kafka's `SchemaRegistryClient` sends: HTTP Basic with a key's id and secret, or a
bearer key; refusals keep Confluent's error shape."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from tests.unit.auth_fixtures import MemoryKeyStore, bearer
from tidegate.gateway.admin.registry_api import create_app
from tidegate.gateway.auth.auth_settings import AuthSettings
from tidegate.gateway.auth.authn import Authenticator
from tidegate.gateway.auth.identity import Grant
from tidegate.gateway.auth.key_verifier import KeyVerifier
from tidegate.gateway.auth.permissions import route_permission
from tidegate.schemas.registry import MemoryLog, SchemaRegistry

SCHEMA = '{"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]}'


@pytest.fixture
def store() -> MemoryKeyStore:
    return MemoryKeyStore()


@pytest.fixture
def client(store: MemoryKeyStore) -> Iterator[TestClient]:
    authenticator = Authenticator(AuthSettings(), keys=KeyVerifier(store), basic=True)
    app = create_app(SchemaRegistry(MemoryLog()), authenticator=authenticator)
    with TestClient(app) as test_client:
        yield test_client


def key(store: MemoryKeyStore, role: str, models: frozenset[str] | None = None) -> str:
    issued = asyncio.run(store.create(role, (Grant(role, models),), created_by="local:t"))
    return issued.key.get_secret_value()


def basic(full_key: str) -> dict[str, str]:
    """As `basic.auth.user.info = "<id>:<secret>"` sends it."""
    _, key_id, secret = full_key.split("_", 2)
    token = base64.b64encode(f"{key_id}:{secret}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def test_anonymous_callers_reach_the_health_check_only(client: TestClient) -> None:
    assert client.get("/_health").status_code == 200
    for method, path, body in (
        ("GET", "/subjects", None),
        ("POST", "/subjects/x-value/versions", {"schema": SCHEMA}),
        ("DELETE", "/subjects/x-value", None),
        ("PUT", "/config", {"compatibility": "NONE"}),
    ):
        answer = client.request(method, path, json=body)
        assert answer.status_code == 401, (method, path, answer.text)
        assert answer.json()["error_code"] == 40101
        assert answer.headers["www-authenticate"].startswith("Basic")


def test_reading_registering_and_breaking_changes_are_three_permissions(
    client: TestClient, store: MemoryKeyStore
) -> None:
    reader, deployer, admin = key(store, "infer"), key(store, "deploy"), key(store, "admin")
    registered = client.post(
        "/subjects/x-value/versions", json={"schema": SCHEMA}, headers=basic(deployer)
    )
    assert registered.status_code == 200, registered.text
    # A lookup is a POST, but a read: every client of the pipeline does it.
    found = client.post("/subjects/x-value", json={"schema": SCHEMA}, headers=basic(reader))
    assert found.status_code == 200, found.text
    assert client.get("/subjects", headers=bearer(reader)).json() == ["x-value"]
    refused = client.post(
        "/subjects/y-value/versions", json={"schema": SCHEMA}, headers=basic(reader)
    )
    assert refused.status_code == 403
    assert refused.json()["error_code"] == 40301
    for who in (reader, deployer):
        assert (
            client.put("/config", json={"compatibility": "NONE"}, headers=basic(who)).status_code
            == 403
        )
        assert client.delete("/subjects/x-value", headers=basic(who)).status_code == 403
    assert (
        client.put("/config", json={"compatibility": "NONE"}, headers=basic(admin)).status_code
        == 200
    )
    assert client.delete("/subjects/x-value", headers=bearer(admin)).status_code == 200


def test_a_deploy_grant_scoped_to_models_registers_nothing(
    client: TestClient, store: MemoryKeyStore
) -> None:
    scoped = key(store, "deploy", frozenset({"fraud"}))
    answer = client.post(
        "/subjects/x-value/versions", json={"schema": SCHEMA}, headers=basic(scoped)
    )
    assert answer.status_code == 403


def test_wrong_or_malformed_credentials_are_refused(
    client: TestClient, store: MemoryKeyStore
) -> None:
    real = key(store, "admin")
    forged = real[:-4] + "AAAA"
    assert client.get("/subjects", headers=basic(forged)).status_code == 401
    garbled = {"Authorization": "Basic not-base64!"}
    assert client.get("/subjects", headers=garbled).status_code == 401
    no_password = {"Authorization": "Basic " + base64.b64encode(b"user").decode()}
    assert client.get("/subjects", headers=no_password).status_code == 401
    whole = {"Authorization": "Basic " + base64.b64encode(f"any:{real}".encode()).decode()}
    assert client.get("/subjects", headers=whole).status_code == 200


def test_every_registry_route_declares_the_permission_it_enforces() -> None:
    app = create_app(SchemaRegistry(MemoryLog()), authenticator=Authenticator(AuthSettings()))
    routes = [r for r in app.routes if isinstance(r, APIRoute)]
    assert routes
    for route in routes:
        declared, enforced = route_permission(route)
        assert declared is not None, route.path
        assert declared == enforced, route.path
