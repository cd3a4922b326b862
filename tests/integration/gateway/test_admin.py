"""`/admin` against the real PostgreSQL, Kafka and registry, through httpx's ASGI transport: the
same flows as the CLI, with the actor from the caller's identity (never `X-Tidegate-Actor`), and
RFC 9457 problems with 404 / 409 / 422 / 400 for unknown things, conflicts, refusals and malformed
input."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.support import free_port
from tests.unit.gateway_harness import Harness
from tidegate.core.settings import (
    KafkaSettings,
    PostgresSettings,
    SchemaRegistrySettings,
    TopicSettings,
)
from tidegate.gateway.admin.lifecycle_api import install_admin, lifecycle_admin
from tidegate.gateway.app import create_app
from tidegate.gateway.auth.authn import Authenticator, install_authenticator
from tidegate.gateway.auth.identity import Identity, grants_of
from tidegate.gateway.problems import PROBLEM_JSON
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.eventstore.event_store import EventStore
from tidegate.lifecycle.eventstore.lifecycle_log import LifecycleLog
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings
from tidegate.lifecycle.operations.commands import LifecycleCommands
from tidegate.models.model_settings import ModelSettings
from tidegate.models.store import LocalArtifactStore

BOB = Identity("key:bob", "api-key", grants_of(["admin"]))


@pytest.fixture
def topics(lifecycle_topic: str) -> TopicSettings:
    return TopicSettings(lifecycle=lifecycle_topic)


@asynccontextmanager
async def open_commands(
    pg: PostgresSettings,
    topics: TopicSettings,
    kafka: KafkaSettings,
    registry: SchemaRegistrySettings,
    store_dir: Path,
    packages_root: Path,
) -> AsyncIterator[LifecycleCommands]:
    lc = LifecycleSettings()
    async with LifecycleLog.from_settings(pg, lc, kafka, topics, registry, publish=True) as log:
        models = ModelSettings(store_dir=store_dir, packages_root=packages_root)
        yield LifecycleCommands(log, log.pool, LocalArtifactStore(models), lc, models=models)


@pytest.fixture
async def commands(
    pg_settings: PostgresSettings,
    topics: TopicSettings,
    kafka_settings: KafkaSettings,
    registry_settings: SchemaRegistrySettings,
    tmp_path: Path,
    packages: Path,
) -> AsyncIterator[LifecycleCommands]:
    async with open_commands(
        pg_settings, topics, kafka_settings, registry_settings, tmp_path / "store", packages
    ) as opened:
        yield opened


@pytest.fixture
async def client(commands: LifecycleCommands) -> AsyncIterator[httpx.AsyncClient]:
    app = FastAPI()
    install_admin(app, commands)
    # Every call is BOB's; the X-Tidegate-Actor headers below must change nothing.
    install_authenticator(app, Authenticator.fixed(BOB))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://admin") as http:
        yield http


def problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM_JSON
    body: dict[str, Any] = response.json()
    assert (body["status"], body["code"]) == (status, code)
    assert body["instance"] == response.request.url.path
    return body


def ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json()


async def register(http: httpx.AsyncClient, packages: Path, version: str, **headers: str) -> Any:
    body = {"path": str(packages / "fraud" / version)}
    return await http.post("/admin/models/fraud/versions", json=body, headers=headers)


async def worker_loaded(commands: LifecycleCommands, version: str) -> None:
    event = ev.NewEvent(ev.VersionLoaded(version, "w1"), actor="worker:w1")
    await EventStore(commands.pool).append("fraud", [event], expected_version=None)


async def test_register_promote_and_read_back(
    client: httpx.AsyncClient, packages: Path, commands: LifecycleCommands
) -> None:
    first = ok(await register(client, packages, "1", **{"X-Tidegate-Actor": "bob"}), 201)
    assert (first["status"], first["action"]) == ("validated", "registered")
    assert {e["actor"] for e in first["events"]} == {BOB.subject}
    again = ok(await register(client, packages, "1"), 200)
    assert again["action"] == "unchanged"
    second = ok(await register(client, packages, "2"), 201)
    assert {e["actor"] for e in second["events"]} == {BOB.subject}

    listed = ok(await client.get("/admin/models"))
    assert [m["model"] for m in listed] == ["fraud"]
    before = datetime.fromisoformat(second["events"][-1]["occurred_at"])
    promoted = ok(
        await client.post(
            "/admin/models/fraud/promote", json={"version": "1"}, headers={"X-Tidegate-Actor": "c"}
        )
    )
    assert promoted["state"]["primary"] == "1"
    state = ok(await client.get("/admin/models/fraud"))
    assert (state["primary"], state["sequence"]) == ("1", 5)
    history = ok(await client.get("/admin/models/fraud/history"))
    assert [(e["type"], e["actor"]) for e in history][-1] == ("Promoted", BOB.subject)

    then = ok(await client.get("/admin/models/fraud/state", params={"at": before.isoformat()}))
    assert (then["state"]["primary"], then["state"]["sequence"]) == (None, 4)
    now = ok(await client.get("/admin/models/fraud/state"))
    assert now["table"]["weights"] == {"1": 100}
    bad = await client.get("/admin/models/fraud/state", params={"at": "yesterday"})
    assert problem(bad, 400, "INVALID_INPUT")["field"] == "at"

    compared = ok(await client.get("/admin/models/fraud/compare", params={"candidate": "2"}))
    assert (compared["stats"]["samples"], compared["gate"]["passed"]) == (0, False)

    async with commands.pool.connection() as conn:
        await conn.execute(
            "INSERT INTO served_requests (request_id, model, version, status, worker_id,"
            " routing_rule, completed_at) VALUES ('req-1', 'fraud', '1', 'OK', 'w1', 'split@5',"
            " %s)",
            (datetime.fromisoformat(promoted["events"][0]["occurred_at"]) + timedelta(seconds=1),),
        )
    served = ok(await client.get("/admin/requests/req-1/served"))
    assert (served["request"]["version"], served["state"]["primary"]) == ("1", "1")
    assert served["lineage"]["registered_by"] == BOB.subject

    problem(await client.get("/admin/models/nope"), 404, "NOT_FOUND")
    problem(await client.get("/admin/models/nope/history"), 404, "NOT_FOUND")
    problem(
        await client.get("/admin/models/fraud/compare", params={"candidate": "9"}), 404, "NOT_FOUND"
    )
    problem(await client.get("/admin/requests/nope/served"), 404, "NOT_FOUND")


async def test_refusals_gate_and_conflicts(
    client: httpx.AsyncClient, packages: Path, commands: LifecycleCommands
) -> None:
    ok(await register(client, packages, "1"), 201)
    ok(await register(client, packages, "2"), 201)
    ok(await client.post("/admin/models/fraud/promote", json={"version": "1"}))
    cold = await client.post("/admin/models/fraud/promote", json={"version": "2"})
    assert "shadow comparisons" in problem(cold, 422, "PROMOTION_GATE")["detail"]
    await worker_loaded(commands, "2")
    gate = await client.post("/admin/models/fraud/promote", json={"version": "2"})
    problem(gate, 422, "PROMOTION_GATE")

    stale = await client.post(
        "/admin/models/fraud/promote", json={"version": "2", "force": True, "expected_sequence": 3}
    )
    conflict = problem(stale, 409, "CONFLICT")
    assert (conflict["expected_sequence"], conflict["actual_sequence"]) == (3, 6)

    # Two operators decide on the same state at once: one wins, the other is told.
    body = {"version": "2", "force": True, "expected_sequence": 6}
    racing = await asyncio.gather(
        client.post("/admin/models/fraud/promote", json=body),
        client.post("/admin/models/fraud/promote", json=body),
    )
    assert sorted(r.status_code for r in racing) == [200, 409]
    won = next(r for r in racing if r.status_code == 200).json()
    assert won["events"][0]["payload"]["forced"] is True

    back = ok(await client.post("/admin/models/fraud/rollback", json={}))
    assert back["state"]["primary"] == "1"
    canary = ok(
        await client.post(
            "/admin/models/fraud/canary", json={"version": "2", "steps": [100], "dwell_s": 2}
        )
    )
    assert canary["state"]["canary"]["steps"] == [100]
    busy = await client.post("/admin/models/fraud/canary", json={"version": "2"})
    problem(busy, 422, "INVALID_TRANSITION")
    ok(await client.post("/admin/models/fraud/rollback", json={"version": "2"}))

    shadow = ok(
        await client.post("/admin/models/fraud/shadow", json={"version": "2", "sample_rate": 0.2})
    )
    assert shadow["state"]["shadows"] == {"2": 0.2}
    ok(await client.post("/admin/models/fraud/shadow", json={"version": "2", "stop": True}))
    ok(await client.post("/admin/models/fraud/pin", json={"tenant": "acme", "version": "2"}))
    problem(
        await client.post("/admin/models/fraud/retire", json={"version": "2"}),
        422,
        "INVALID_TRANSITION",
    )
    ok(await client.post("/admin/models/fraud/unpin", json={"rule_id": "pin-acme"}))
    bad_split = {"weights": {"1": 70, "2": 70}}
    problem(
        await client.post("/admin/models/fraud/experiment", json=bad_split),
        422,
        "INVALID_TRANSITION",
    )
    split = ok(
        await client.post("/admin/models/fraud/experiment", json={"weights": {"1": 50, "2": 50}})
    )
    assert split["state"]["rules"][0]["weights"] == {"1": 50, "2": 50}
    ok(await client.post("/admin/models/fraud/unpin", json={"rule_id": "experiment-all"}))
    retired = ok(await client.post("/admin/models/fraud/retire", json={"version": "2"}))
    assert retired["state"]["versions"][1]["status"] == "retired"

    # fraud-lite is not registered here: a fallback must be a model with a primary.
    unknown = await client.post("/admin/models/fraud/fallback", json={"fallback": "fraud-lite"})
    problem(unknown, 422, "INVALID_TRANSITION")
    own = await client.post("/admin/models/fraud/fallback", json={"fallback": "fraud"})
    problem(own, 422, "INVALID_TRANSITION")

    extra = await client.post("/admin/models/fraud/promote", json={"version": "1", "x": 1})
    problem(extra, 400, "INVALID_INPUT")
    rate = await client.post("/admin/models/fraud/shadow", json={"version": "1", "sample_rate": 2})
    problem(rate, 400, "INVALID_INPUT")
    missing = await client.post("/admin/models/fraud/versions", json={"path": "/nonexistent"})
    problem(missing, 422, "ARTIFACT")
    # Outside the packages root: the same answer as for a path that does not exist.
    outside = await client.post("/admin/models/fraud/versions", json={"path": "/etc"})
    assert "packages root" in problem(outside, 422, "ARTIFACT")["detail"]


def test_create_app_mounts_admin_only_with_a_lifecycle(
    tmp_path: Path,
    pg_settings: PostgresSettings,
    topics: TopicSettings,
    packages: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    harness = Harness(tmp_path)
    config = dataclasses.replace(harness.config, topics=topics, postgres=pg_settings)
    monkeypatch.setenv("TIDEGATE_MODELS_STORE_DIR", str(tmp_path / "store"))
    monkeypatch.setenv("TIDEGATE_MODELS_PACKAGES_ROOT", str(packages))
    app = create_app(config, lambda _c: harness.services, admin=lifecycle_admin)
    with TestClient(app) as http:
        assert http.get("/admin/models").json() == []
        created = http.post(
            "/admin/models/fraud/versions",
            json={"path": str(packages / "fraud" / "1")},
            headers={"X-Tidegate-Actor": "dana"},
        )
        assert created.status_code == 201, created.text
        # The harness runs without authentication: the actor is the insecure local admin.
        assert created.json()["events"][0]["actor"] == "local:insecure"
        assert http.get("/v2/health/live").status_code == 200
    with TestClient(create_app(config, lambda _c: harness.services)) as http:
        response = http.get("/admin/models")
        assert response.status_code == 404
        assert response.headers["content-type"] == PROBLEM_JSON


def test_without_postgres_the_gateway_serves_and_admin_answers_503(tmp_path: Path) -> None:
    harness = Harness(tmp_path)
    # /admin's event store is the gateway's PostgreSQL: here one nobody listens on.
    config = dataclasses.replace(harness.config, postgres=PostgresSettings(port=free_port()))
    app = create_app(config, lambda _c: harness.services, admin=lifecycle_admin)
    with TestClient(app) as http:
        assert http.get("/v2/models/fraud").status_code == 200
        down = http.get("/admin/models")
        assert down.status_code == 503
        assert down.json()["code"] == "LIFECYCLE_UNAVAILABLE"
