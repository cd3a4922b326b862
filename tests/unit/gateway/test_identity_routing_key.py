"""A caller whose identity names a routing key (a key's `--routing-key`, a token's routing key
claim) cannot pick its own: every call of its has that routing key, so it cannot steer itself to
one side of a weighted split or to a partition; a parameter may repeat it, never name another
(403). Callers whose identity names none choose theirs, as before."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.unit.auth_fixtures import MemoryKeyStore, bearer
from tests.unit.gateway_harness import features, problem_of, secured
from tidegate.gateway.auth.auth_settings import AuthSettings
from tidegate.gateway.auth.identity import Grant
from tidegate.gateway.auth.jwt_verify import identity_from_claims


def test_a_keys_routing_key_is_every_call_of_its(tmp_path: Path) -> None:
    store = MemoryKeyStore()
    harness = secured(tmp_path, store)
    infer = (Grant("infer"),)
    bound = bearer(
        asyncio.run(store.create("t", infer, created_by="local:t", routing_key="card-42")).key
    )
    anyone = bearer(asyncio.run(store.create("t", infer, created_by="local:t")).key)
    mine, theirs = {"routing_key": "card-42"}, {"routing_key": "card-7"}
    with harness.client() as http:
        ok = http.post("/v2/models/fraud/infer", json=features(), headers=bound)
        assert ok.status_code == 200, ok.text
        same = http.post("/v2/models/fraud/infer", json=features(parameters=mine), headers=bound)
        assert same.status_code == 200, same.text
        other = http.post("/v2/models/fraud/infer", json=features(parameters=theirs), headers=bound)
        assert "card-42" in problem_of(other, 403)["detail"]
        free = http.post("/v2/models/fraud/infer", json=features(parameters=theirs), headers=anyone)
        assert free.status_code == 200, free.text
    assert [r["routing_key"] for r in harness.worker.published] == ["card-42", "card-42", "card-7"]


def test_a_tokens_routing_key_claim_names_its_routing_key() -> None:
    settings = AuthSettings()
    claims = {"iss": "idp", "sub": "svc", "roles": "infer"}
    named = identity_from_claims({**claims, "routing_key": "card-42"}, settings)
    assert named.routing_key == "card-42"
    assert identity_from_claims(claims, settings).routing_key is None
    assert identity_from_claims({**claims, "routing_key": 7}, settings).routing_key is None
