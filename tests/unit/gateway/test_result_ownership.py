"""Results by id belong to who asked for them: `GET /v2/requests/{id}` shows a stored result only
to the subject that made the request, or to an unscoped admin, and answers anyone else 404 as for
an unknown id; a caller-chosen id that names another subject's stored request is refused (409)
rather than taken over or overwritten; `GET /admin/requests/{id}/served` shows lineage only of a
model the caller may read. With `--insecure` everything stays everyone's (`local:insecure`)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.support import wait_for
from tests.unit.auth_fixtures import MemoryKeyStore, bearer
from tests.unit.gateway_harness import Harness, features, problem_of, secured
from tidegate.core.errors import ModelNotFoundError
from tidegate.gateway.admin.lifecycle_api import install_admin
from tidegate.gateway.app import create_app
from tidegate.gateway.auth.identity import Grant

ASYNC = {"Prefer": "respond-async"}


@pytest.fixture
def store() -> MemoryKeyStore:
    return MemoryKeyStore()


def key(store: MemoryKeyStore, *grants: Grant) -> dict[str, str]:
    issued = asyncio.run(store.create("t", grants, created_by="local:t"))
    return bearer(issued.key)


def fetched(http: TestClient, request_id: str, headers: dict[str, str]) -> httpx.Response:
    """GET /v2/requests/{id} once it is no longer pending."""

    def probe() -> httpx.Response | None:
        resp = http.get(f"/v2/requests/{request_id}", headers=headers)
        return resp if resp.status_code != 202 else None

    return wait_for(probe, timeout=5, what=f"the result of {request_id}")


def unknown_detail(http: TestClient, request_id: str, headers: dict[str, str]) -> str:
    resp = http.get(f"/v2/requests/{request_id}", headers=headers)
    detail: str = problem_of(resp, 404)["detail"]
    return detail


def test_only_the_owner_and_an_unscoped_admin_fetch_an_async_result(
    tmp_path: Path, store: MemoryKeyStore
) -> None:
    harness = secured(tmp_path, store)
    alice = key(store, Grant("infer", frozenset({"fraud"})))
    mallory = key(store, Grant("infer", frozenset({"fraud-lite"})))
    other_fraud = key(store, Grant("infer", frozenset({"fraud"})))
    admin = key(store, Grant("admin"))
    scoped_admin = key(store, Grant("admin", frozenset({"fraud"})))
    with harness.client() as http:
        accepted = http.post(
            "/v2/models/fraud/infer", json=features(id="order-123"), headers={**alice, **ASYNC}
        )
        assert accepted.status_code == 202, accepted.text
        mine = fetched(http, "order-123", alice)
        assert mine.status_code == 200, mine.text
        assert mine.json()["outputs"][0]["name"] == "probabilities"
        assert fetched(http, "order-123", admin).json() == mine.json()
        # Anyone else: the answer for an id nobody used, so it does not tell that it exists.
        for stranger in (mallory, other_fraud, scoped_admin):
            body = problem_of(http.get("/v2/requests/order-123", headers=stranger), 404)
            assert body["code"] == "REQUEST_NOT_FOUND"
            assert "probabilities" not in str(body)
            never = unknown_detail(http, "never-used", alice)
            assert body["detail"].replace("order-123", "x") == never.replace("never-used", "x")
    stored = harness.store.requests["order-123"]
    assert (stored.owner or "").startswith("key:")
    assert (stored.meta or {})["model"] == "fraud"


def test_a_pending_result_is_hidden_from_other_callers_too(
    tmp_path: Path, store: MemoryKeyStore
) -> None:
    harness = secured(tmp_path, store)
    harness.worker.hold = True
    alice, bob = key(store, Grant("infer")), key(store, Grant("infer"))
    with harness.client() as http:
        http.post("/v2/models/fraud/infer", json=features(id="p-1"), headers={**alice, **ASYNC})
        assert http.get("/v2/requests/p-1", headers=alice).status_code == 202
        problem_of(http.get("/v2/requests/p-1", headers=bob), 404)
        harness.worker.release("p-1")
        assert fetched(http, "p-1", alice).status_code == 200


def test_an_id_of_another_callers_result_cannot_be_reused(
    tmp_path: Path, store: MemoryKeyStore
) -> None:
    harness = secured(tmp_path, store)
    alice = key(store, Grant("infer", frozenset({"fraud"})))
    mallory = key(store, Grant("infer", frozenset({"fraud", "fraud-lite"})))
    with harness.client() as http:
        http.post(
            "/v2/models/fraud/infer", json=features(id="order-123"), headers={**alice, **ASYNC}
        )
        original = fetched(http, "order-123", alice).json()
        stored = harness.store.requests["order-123"]
        published = len(harness.worker.published)

        # Asynchronous: refused before it is published.
        taken = http.post(
            "/v2/models/fraud/infer",
            json=features(rows=3, id="order-123"),
            headers={**mallory, **ASYNC},
        )
        body = problem_of(taken, 409)
        assert (body["code"], body["field"]) == ("REQUEST_ID_TAKEN", "id")
        assert len(harness.worker.published) == published

        # Synchronous: refused too, before it is published (the id is claimed in the store,
        # which every replica shares), so no reply can be handed to her.
        sync = http.post(
            "/v2/models/fraud/infer", json=features(rows=3, id="order-123"), headers=mallory
        )
        assert problem_of(sync, 409)["code"] == "REQUEST_ID_TAKEN"
        assert "Location" not in sync.headers
        assert len(harness.worker.published) == published
        assert harness.store.requests["order-123"] == stored
        assert fetched(http, "order-123", alice).json() == original

        # The owner may reuse her own id.
        harness.worker.hold = False
        again = http.post(
            "/v2/models/fraud/infer", json=features(id="order-123"), headers={**alice, **ASYNC}
        )
        assert again.status_code == 202, again.text


def test_a_sync_call_answered_in_time_only_reserves_the_id_it_chose(
    tmp_path: Path, store: MemoryKeyStore
) -> None:
    harness = secured(tmp_path, store)
    alice = key(store, Grant("infer"))
    with harness.client() as http:
        ok = http.post("/v2/models/fraud/infer", json=features(), headers=alice)
        assert ok.status_code == 200, ok.text
        assert harness.store.calls == [], "the gateway's own random id needs no reservation"
        ok = http.post("/v2/models/fraud/infer", json=features(id="s-1"), headers=alice)
        assert ok.status_code == 200, ok.text
    assert harness.store.calls == [("reserve", "s-1"), ("release", "s-1")]
    assert harness.store.requests == {}


def test_a_pending_async_id_cannot_be_taken_by_a_sync_call_on_the_same_replica(
    tmp_path: Path, store: MemoryKeyStore
) -> None:
    """The held-out probe's takeover: Alice's asynchronous `order-123` is pending when Mallory
    sends a synchronous call with the same id. She is refused; Alice's result stays Alice's."""
    harness = secured(tmp_path, store)
    harness.worker.hold = True
    alice, mallory = key(store, Grant("infer")), key(store, Grant("infer"))
    with harness.client() as http:
        accepted = http.post(
            "/v2/models/fraud/infer", json=features(id="order-123"), headers={**alice, **ASYNC}
        )
        assert accepted.status_code == 202, accepted.text
        for headers in (mallory, {**mallory, **ASYNC}):
            taken = http.post(
                "/v2/models/fraud/infer", json=features(rows=3, id="order-123"), headers=headers
            )
            assert problem_of(taken, 409)["code"] == "REQUEST_ID_TAKEN"
        assert len(harness.worker.published) == 1
        harness.worker.release("order-123")
        mine = fetched(http, "order-123", alice)
        assert mine.status_code == 200, mine.text
        assert mine.json()["outputs"][0]["shape"][0] == 2, "Alice's own two rows"


def test_insecure_keeps_every_result_everyones(tmp_path: Path) -> None:
    harness = Harness(tmp_path)  # AuthSettings(enabled=False): what --insecure sets
    with harness.client() as http:
        http.post("/v2/models/fraud/infer", json=features(id="i-1"), headers=ASYNC)
        assert fetched(http, "i-1", {}).status_code == 200
        again = http.post("/v2/models/fraud/infer", json=features(id="i-1"), headers=ASYNC)
        assert again.status_code == 202
    assert harness.store.requests["i-1"].owner == "local:insecure"


class ServedCommands:
    """`served` of the lifecycle commands: the lineage view of two indexed requests."""

    async def served(self, request_id: str) -> dict[str, Any]:
        models = {"r-fraud": "fraud", "r-echo": "echo"}
        if request_id not in models:
            raise ModelNotFoundError(
                f"no served request {request_id!r} is indexed "
                "(unknown, not indexed yet, or older than the lineage retention)"
            )
        return {"request": {"request_id": request_id, "model": models[request_id]}, "lineage": {}}


def test_served_lineage_needs_read_on_the_requests_model(
    tmp_path: Path, store: MemoryKeyStore
) -> None:
    harness = secured(tmp_path, store)
    app: FastAPI = create_app(
        harness.config, lambda _c: harness.services, authenticator=harness.authenticator
    )
    install_admin(app, ServedCommands())  # type: ignore[arg-type]
    fraud_only = key(store, Grant("infer", frozenset({"fraud"})))
    reader = key(store, Grant("infer"))
    with TestClient(app) as http:
        assert http.get("/admin/requests/r-fraud/served", headers=fraud_only).status_code == 200
        hidden = problem_of(http.get("/admin/requests/r-echo/served", headers=fraud_only), 404)
        unknown = problem_of(http.get("/admin/requests/r-none/served", headers=fraud_only), 404)
        assert hidden["code"] == unknown["code"]
        assert hidden["detail"].replace("r-echo", "x") == unknown["detail"].replace("r-none", "x")
        assert "lineage" not in hidden
        assert http.get("/admin/requests/r-echo/served", headers=reader).status_code == 200
