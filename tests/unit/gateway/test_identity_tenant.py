"""A caller whose identity names a tenant (a key's `--tenant`, a token's tenant claim) makes
every call that tenant's: its `tenant` parameter may repeat it, never name another (403)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.unit.auth_fixtures import MemoryKeyStore, bearer
from tests.unit.gateway_harness import features, problem_of, secured
from tidegate.gateway.auth.auth_settings import AuthSettings
from tidegate.gateway.auth.identity import Grant
from tidegate.gateway.auth.jwt_verify import identity_from_claims


def test_a_keys_tenant_is_every_call_of_its(tmp_path: Path) -> None:
    store = MemoryKeyStore()
    harness = secured(tmp_path, store)
    acme = bearer(
        asyncio.run(store.create("t", (Grant("infer"),), created_by="local:t", tenant="acme")).key
    )
    anyone = bearer(asyncio.run(store.create("t", (Grant("infer"),), created_by="local:t")).key)
    with harness.client() as http:
        ok = http.post("/v2/models/fraud/infer", json=features(), headers=acme)
        assert ok.status_code == 200, ok.text
        same = http.post(
            "/v2/models/fraud/infer", json=features(parameters={"tenant": "acme"}), headers=acme
        )
        assert same.status_code == 200, same.text
        other = http.post(
            "/v2/models/fraud/infer", json=features(parameters={"tenant": "globex"}), headers=acme
        )
        assert "acme" in problem_of(other, 403)["detail"]
        free = http.post(
            "/v2/models/fraud/infer", json=features(parameters={"tenant": "globex"}), headers=anyone
        )
        assert free.status_code == 200, free.text
    assert [r["tenant"] for r in harness.worker.published] == ["acme", "acme", "globex"]


def test_a_tokens_tenant_claim_names_its_tenant() -> None:
    settings = AuthSettings()
    claims = {"iss": "idp", "sub": "svc", "roles": "infer"}
    assert identity_from_claims({**claims, "tenant": "acme"}, settings).tenant == "acme"
    assert identity_from_claims(claims, settings).tenant is None
    assert identity_from_claims({**claims, "tenant": 7}, settings).tenant is None
