"""The authenticator (tidegate.gateway.auth.authn): which verifier a credential goes to, what a
malformed header gets, and `--insecure`, where everyone is the local admin."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.requests import Request

from tests.unit.auth_fixtures import AUDIENCE, ISSUER, MemoryKeyStore
from tidegate.core.errors import AuthenticationError
from tidegate.core.settings import PostgresSettings
from tidegate.gateway.auth.auth_settings import AuthSettings
from tidegate.gateway.auth.authn import INSECURE, Authenticator
from tidegate.gateway.auth.identity import ANONYMOUS, Grant, Permission
from tidegate.gateway.auth.key_verifier import KeyVerifier


def request(authorization: str | None = None) -> Request:
    headers = [] if authorization is None else [(b"authorization", authorization.encode())]
    scope: dict[str, Any] = {"type": "http", "method": "GET", "path": "/", "headers": headers}
    return Request(scope)


async def test_no_credentials_is_the_anonymous_caller() -> None:
    identity = await Authenticator(AuthSettings()).authenticate(request())
    assert identity is ANONYMOUS
    assert not identity.allows(Permission.READ)


@pytest.mark.parametrize("header", ["Basic dTpw", "Bearer", "Bearer   ", "tg_abc", "Token x"])
async def test_anything_but_a_bearer_credential_is_refused(header: str) -> None:
    with pytest.raises(AuthenticationError, match="Authorization: Bearer"):
        await Authenticator(AuthSettings()).authenticate(request(header))


async def test_keys_go_to_the_key_verifier_and_other_bearers_to_the_jwt_one() -> None:
    store = MemoryKeyStore()
    issued = await store.create("t", (Grant("infer"),), created_by="local:t")
    keys_only = Authenticator(AuthSettings(), keys=KeyVerifier(store))
    found = await keys_only.authenticate(request(f"Bearer {issued.key.get_secret_value()}"))
    assert found.subject == issued.record.subject
    with pytest.raises(AuthenticationError, match="bearer tokens are not accepted"):
        await keys_only.authenticate(request("Bearer eyJhbGciOi.x.y"))
    with pytest.raises(AuthenticationError, match="API keys are not accepted"):
        await Authenticator(AuthSettings()).authenticate(request("Bearer tg_x_y"))


async def test_insecure_makes_everyone_the_local_admin_whatever_they_present() -> None:
    insecure = Authenticator.from_settings(AuthSettings(enabled=False), PostgresSettings())
    assert insecure.insecure
    assert insecure.keys is None and insecure.tokens is None  # noqa: PT018
    for header in (None, "Basic x", "Bearer tg_forged_key"):
        assert await insecure.authenticate(request(header)) is INSECURE
    assert INSECURE.subject == "local:insecure"
    assert INSECURE.allows(Permission.ADMIN, "any-model")


def test_the_gateway_builds_key_and_token_verifiers_from_its_settings() -> None:
    default = Authenticator.from_settings(AuthSettings(), PostgresSettings())
    assert default.keys is not None and default.tokens is None  # noqa: PT018
    jwt_only = AuthSettings(
        api_keys=False,
        jwt_issuer=ISSUER,
        jwt_audience=AUDIENCE,
        jwt_jwks_url="http://127.0.0.1:1/jwks.json",
    )
    built = Authenticator.from_settings(jwt_only, PostgresSettings())
    assert built.keys is None and built.tokens is not None  # noqa: PT018
