"""The local stack's schema registry authenticates every caller (docs/security.md): the held-out
probe's anonymous register, delete and compatibility change are refused, registering needs
`deploy` and deleting or changing compatibility `admin`, and the stack's own processes get in
with the key `make up` made for them."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.integration.schemas.registry_keys import basic_auth, issue_key, revoke_key
from tests.support import unique
from tidegate.core.settings import SchemaRegistrySettings

SCHEMA = '{"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]}'
CT = {"Content-Type": "application/vnd.schemaregistry.v1+json"}


@pytest.fixture
def admin_key() -> Iterator[str]:
    key = issue_key("admin")
    yield key
    revoke_key(key)


@pytest.fixture
def registry() -> SchemaRegistrySettings:
    settings = SchemaRegistrySettings()
    assert settings.basic_auth_user, "make up leaves the stack's credentials in var/registry"
    return settings


def test_anonymous_writes_deletes_and_config_changes_are_refused(
    registry: SchemaRegistrySettings,
) -> None:
    subject = unique("it-anon") + "-value"
    with httpx.Client(base_url=registry.url, headers=CT, timeout=10) as anonymous:
        for answer in (
            anonymous.post(f"/subjects/{subject}/versions", json={"schema": SCHEMA}),
            anonymous.delete(f"/subjects/{subject}"),
            anonymous.put("/config", json={"compatibility": "NONE"}),
            anonymous.get("/subjects"),
        ):
            assert answer.status_code == 401, answer.text
            assert answer.json()["error_code"] == 40101
        assert anonymous.get("/_health").status_code == 200


def test_registering_needs_deploy_and_deleting_admin(
    registry: SchemaRegistrySettings, admin_key: str
) -> None:
    subject = unique("it-auth") + "-value"
    deployer = issue_key("deploy")
    admin = {"Authorization": f"Bearer {admin_key}", **CT}
    try:
        with httpx.Client(
            base_url=registry.url, headers=CT, auth=basic_auth(deployer), timeout=10
        ) as client:
            made = client.post(f"/subjects/{subject}/versions", json={"schema": SCHEMA})
            assert made.status_code == 200, made.text
            assert client.post(f"/subjects/{subject}", json={"schema": SCHEMA}).status_code == 200
            assert client.delete(f"/subjects/{subject}").status_code == 403
            assert client.put("/config", json={"compatibility": "NONE"}).status_code == 403
    finally:
        revoke_key(deployer)
    gone = httpx.delete(f"{registry.url}/subjects/{subject}", headers=admin, timeout=10)
    assert gone.status_code == 200, gone.text


def test_the_stacks_own_processes_get_in_with_its_key(registry: SchemaRegistrySettings) -> None:
    assert registry.basic_auth_password is not None
    stack = (registry.basic_auth_user or "", registry.basic_auth_password.get_secret_value())
    with httpx.Client(base_url=registry.url, headers=CT, auth=stack, timeout=10) as client:
        assert client.get("/subjects").status_code == 200
