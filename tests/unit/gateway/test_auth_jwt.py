"""JWT bearer tokens verified against an issuer's JWKS (tidegate.gateway.auth.jwt_verify), and the
settings that keep unsafe algorithms out (tidegate.gateway.auth.auth_settings). The issuer is a
local one (tests/unit/auth_fixtures.py): RSA keys from `cryptography`, its JWKS over HTTP."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from pydantic import ValidationError

from tests.unit.auth_fixtures import AUDIENCE, ISSUER, Issuer
from tidegate.core.errors import AuthenticationError, RateLimitedError
from tidegate.gateway.auth.auth_settings import AuthSettings
from tidegate.gateway.auth.client_budget import ClientBudget
from tidegate.gateway.auth.identity import Permission
from tidegate.gateway.auth.jwt_verify import JwtVerifier

# Serves the issuer's JWKS over HTTP.
pytestmark = pytest.mark.slow


@pytest.fixture
def issuer() -> Iterator[Issuer]:
    made = Issuer()
    yield made
    made.close()


def settings_for(issuer: Issuer, **extra: object) -> AuthSettings:
    values: dict[str, object] = {
        "jwt_issuer": ISSUER,
        "jwt_audience": AUDIENCE,
        "jwt_jwks_url": issuer.jwks_url,
        "jwt_jwks_min_refresh_s": 0,
        **extra,
    }
    return AuthSettings.model_validate(values)


@pytest.fixture
def verifier(issuer: Issuer) -> JwtVerifier:
    return JwtVerifier(settings_for(issuer))


async def test_a_valid_token_is_its_identity_and_is_cached(
    issuer: Issuer, verifier: JwtVerifier
) -> None:
    token = issuer.token(roles=["deploy", "unknown-role"])
    identity = await verifier.verify(token)
    assert identity.subject == f"jwt:{ISSUER}/alice"
    assert identity.kind == "jwt"
    assert identity.roles == ["deploy"]
    assert identity.allows(Permission.DEPLOY, "fraud")
    fetched = issuer.fetches
    assert await verifier.verify(token) is identity
    assert issuer.fetches == fetched == 1


async def test_roles_as_a_string_and_scoped_to_the_models_claim(issuer: Issuer) -> None:
    verifier = JwtVerifier(
        settings_for(issuer, jwt_roles_claim="tidegate_roles", jwt_models_claim="models")
    )
    token = issuer.token(roles=[], tidegate_roles="infer deploy", models=["fraud"])
    identity = await verifier.verify(token)
    assert identity.roles == ["deploy", "infer"]
    assert identity.allows(Permission.INFER, "fraud")
    assert not identity.allows(Permission.INFER, "minilm")
    no_roles = await verifier.verify(issuer.token(sub="bob", roles=[]))
    assert not no_roles.allows(Permission.READ)


async def test_expired_tokens_are_refused_within_the_leeway_only(issuer: Issuer) -> None:
    verifier = JwtVerifier(settings_for(issuer, jwt_leeway_s=30))
    assert await verifier.verify(issuer.token(expires_in=-10))  # 10 s of clock skew: fine
    with pytest.raises(AuthenticationError, match="expired"):
        await verifier.verify(issuer.token(expires_in=-60))


@pytest.mark.parametrize(
    ("claims", "reason"),
    [
        ({"aud": "another-service"}, "InvalidAudienceError"),
        ({"iss": "https://evil.test"}, "InvalidIssuerError"),
        ({"nbf": int(time.time()) + 3600}, "ImmatureSignatureError"),
    ],
)
async def test_claims_are_checked(
    issuer: Issuer, verifier: JwtVerifier, claims: dict[str, Any], reason: str
) -> None:
    with pytest.raises(AuthenticationError, match="invalid bearer token") as refused:
        await verifier.verify(issuer.token(**claims))
    assert reason in refused.value.reason


async def test_a_token_without_exp_or_sub_is_refused(issuer: Issuer, verifier: JwtVerifier) -> None:
    key = issuer.keys[issuer.published[-1]]
    headers = {"kid": issuer.published[-1]}
    base = {"iss": ISSUER, "aud": AUDIENCE}
    for payload in ({**base, "sub": "a"}, {**base, "exp": int(time.time()) + 60}):
        token = jwt.encode(payload, key, algorithm="RS256", headers=headers)
        with pytest.raises(AuthenticationError, match="invalid bearer token"):
            await verifier.verify(token)


async def test_a_token_signed_by_another_key_is_refused(
    issuer: Issuer, verifier: JwtVerifier
) -> None:
    forger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    with pytest.raises(AuthenticationError) as refused:
        await verifier.verify(issuer.token(key=forger))
    assert "InvalidSignatureError" in refused.value.reason


async def test_none_and_hmac_with_the_public_key_are_refused(
    issuer: Issuer, verifier: JwtVerifier
) -> None:
    kid = issuer.published[-1]
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": "mallory", "exp": int(time.time()) + 60}
    unsigned = jwt.encode(claims, "", algorithm="none", headers={"kid": kid})
    with pytest.raises(AuthenticationError):
        await verifier.verify(unsigned)
    # The classic confusion: HS256 "signed" with the issuer's public key as the HMAC secret.
    public = (
        issuer.keys[kid].public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    )

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    head = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": kid}).encode())
    body = b64(json.dumps({**claims, "roles": ["admin"]}).encode())
    mac = hmac.new(public, f"{head}.{body}".encode(), hashlib.sha256).digest()
    with pytest.raises(AuthenticationError):
        await verifier.verify(f"{head}.{body}.{b64(mac)}")


async def test_a_rotated_key_is_fetched_when_a_token_names_it(
    issuer: Issuer, verifier: JwtVerifier
) -> None:
    await verifier.verify(issuer.token())
    assert issuer.fetches == 1
    new_kid = issuer.rotate()
    identity = await verifier.verify(issuer.token(kid=new_kid, sub="carol"))
    assert identity.subject.endswith("/carol")
    assert issuer.fetches == 2
    with pytest.raises(AuthenticationError, match="invalid bearer token"):
        await verifier.verify(issuer.token(kid="made-up"))


async def test_unknown_key_ids_refetch_at_most_once_per_cooldown(issuer: Issuer) -> None:
    verifier = JwtVerifier(settings_for(issuer, jwt_jwks_min_refresh_s=60))
    await verifier.verify(issuer.token())
    for n in range(5):
        with pytest.raises(AuthenticationError):
            await verifier.verify(issuer.token(kid=f"made-up-{n}"))
    assert issuer.fetches == 1


def test_unsafe_algorithms_and_half_configured_issuers_are_refused() -> None:
    for bad in (["none"], ["HS256"], ["RS256", "hs512"], []):
        with pytest.raises(ValidationError):
            AuthSettings(jwt_algorithms=bad)
    with pytest.raises(ValidationError, match="together"):
        AuthSettings(jwt_issuer=ISSUER)
    assert AuthSettings().enabled  # on by default
    assert AuthSettings().revocation_s <= 3
    with pytest.raises(ValidationError):
        AuthSettings(revocation_s=10)


@pytest.mark.parametrize(
    "url", ["http://issuer.example.com/jwks", "file:///etc/passwd", "ftp://issuer/jwks"]
)
def test_the_jwks_is_fetched_over_tls_or_from_this_host_only(url: str) -> None:
    with pytest.raises(ValueError, match="https://"):
        AuthSettings(jwt_issuer="i", jwt_audience="a", jwt_jwks_url=url)
    for fine in ("https://issuer.example.com/jwks", "http://127.0.0.1:8000/jwks"):
        assert AuthSettings(jwt_issuer="i", jwt_audience="a", jwt_jwks_url=fine).jwt_jwks_url


async def test_tokens_no_cache_answers_are_charged_to_their_address(issuer: Issuer) -> None:
    verifier = JwtVerifier(settings_for(issuer), budget=ClientBudget(2, "token checks"))
    token = issuer.token(roles=["infer"])
    for _ in range(5):  # one signature check, then the cache: one unit spent
        await verifier.verify(token, "203.0.113.7")
    with pytest.raises(AuthenticationError):
        await verifier.verify("not-a-token", "203.0.113.7")
    with pytest.raises(RateLimitedError):
        await verifier.verify("another-bogus-token", "203.0.113.7")
    # Another address has a budget of its own.
    with pytest.raises(AuthenticationError):
        await verifier.verify("another-bogus-token", "198.51.100.2")
