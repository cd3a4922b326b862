"""Authentication and authorization of the gateway against the real PostgreSQL (API keys in the
test's own schema) and a local OIDC issuer (its JWKS over HTTP): what authentication must show.

The V2 path's Kafka side is the in-memory fake of tests/unit/gateway_harness.py (these tests are
about who may call, not about the pipeline); /admin runs the real lifecycle commands over the
test's own schema and lifecycle topic. Two app instances over one database are two replicas:
each has its own cache of verified keys, which is what revocation must get past.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from typer.testing import CliRunner
from yoyo import get_backend, read_migrations

from tests.integration.gateway.gateway_fixtures import served
from tests.support import unique, wait_for
from tests.unit.auth_fixtures import AUDIENCE, ISSUER, Issuer, bearer
from tests.unit.gateway_harness import FRAUD, Harness, features
from tidegate.cli import app as cli_app
from tidegate.cli.lifecycle_session import ACTOR_ENV
from tidegate.clients.audit import KafkaAuditTrail
from tidegate.clients.audit_reader import AuditFilter, AuditReader
from tidegate.core.db import MIGRATIONS_DIR, make_pool, migrate
from tidegate.core.settings import (
    KafkaSettings,
    PostgresSettings,
    SchemaRegistrySettings,
    TopicSettings,
)
from tidegate.gateway.admin.lifecycle_api import lifecycle_admin
from tidegate.gateway.app import create_app
from tidegate.gateway.auth.api_keys import KeyRecord, KeyStore
from tidegate.gateway.auth.auth_settings import AuthSettings
from tidegate.gateway.auth.identity import Grant, Permission
from tidegate.gateway.auth.permissions import route_permission
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.eventstore.event_store import EventStore
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings
from tidegate.schemas.catalog import AUDIT_EVENT
from tidegate.schemas.registration import RegistryHttp, register_all

T = TypeVar("T")
REVOKED_WITHIN_S = 5.0


@pytest.fixture
def topics(lifecycle_topic: str) -> TopicSettings:
    return TopicSettings(lifecycle=lifecycle_topic)


def gateway(
    tmp_path: Path,
    pg: PostgresSettings,
    topics: TopicSettings,
    *,
    admin: bool = False,
    **auth: Any,
) -> tuple[FastAPI, Harness]:
    """One gateway replica: real authentication over `pg`, the fake pipeline behind it."""
    harness = Harness(tmp_path)
    config = dataclasses.replace(
        harness.config, topics=topics, postgres=pg, auth=AuthSettings(**auth)
    )
    app = create_app(config, lambda _c: harness.services, admin=lifecycle_admin if admin else None)
    return app, harness


@pytest.fixture
def lifecycle_env(
    pg_settings: PostgresSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # lifecycle_admin's event store is the gateway's PostgreSQL (`gateway` above passes `pg`);
    # a gateway built from the environment, as `tidegate gateway` is, reads this schema.
    monkeypatch.setenv("TIDEGATE_POSTGRES_DB_SCHEMA", pg_settings.db_schema)
    monkeypatch.setenv("TIDEGATE_MODELS_STORE_DIR", str(tmp_path / "store"))


class Keys:
    """The test's own access to the `api_keys` table, one short-lived pool per call (each
    `asyncio.run` is an event loop of its own)."""

    def __init__(self, pg: PostgresSettings) -> None:
        self.pg = pg

    def run(self, action: Callable[[KeyStore], Awaitable[T]]) -> T:
        async def go() -> T:
            pool = make_pool(self.pg, LifecycleSettings(pool_min_size=1, pool_max_size=1))
            await pool.open(wait=True, timeout=15)
            try:
                return await action(KeyStore(pool))
            finally:
                await pool.close()

        return asyncio.run(go())

    def new(self, *grants: Grant) -> tuple[str, dict[str, str]]:
        """A fresh key's id, and the headers that present it."""
        issued = self.run(lambda store: store.create("it", grants, created_by="local:it"))
        return issued.record.id, bearer(issued.key)


@pytest.fixture
def keys(pg_settings: PostgresSettings) -> Keys:
    return Keys(pg_settings)


def concrete(path: str) -> str:
    values = {"model": "fraud", "name": "fraud", "partition": "0", "offset": "0"}
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), "x"), path)


def protected_routes(app: FastAPI, prefix: str) -> list[tuple[str, str]]:
    out = []
    for route in app.routes:
        if isinstance(route, APIRoute) and route.path.startswith(prefix):
            for method in sorted(route.methods):
                out.append((method, concrete(route.path)))
    return out


def test_anonymous_calls_get_401_on_inference_and_on_every_admin_route(
    tmp_path: Path, pg_settings: PostgresSettings, topics: TopicSettings, lifecycle_env: None
) -> None:
    app, harness = gateway(tmp_path, pg_settings, topics, admin=True)
    admin_routes = protected_routes(app, "/admin")
    assert len(admin_routes) >= 20
    with TestClient(app) as http:
        refused = http.post("/v2/models/fraud/infer", json=features())
        assert refused.status_code == 401
        assert refused.headers["WWW-Authenticate"].startswith("Bearer")
        assert refused.json()["code"] == "UNAUTHENTICATED"
        for method, path in admin_routes:
            resp = http.request(method, path, json={} if method == "POST" else None)
            assert resp.status_code == 401, f"{method} {path}: {resp.status_code}"
            assert resp.headers["content-type"] == "application/problem+json"
        assert http.get("/v2/health/ready").status_code == 200
    assert harness.worker.published == []


def test_an_infer_key_gets_403_on_admin_and_a_scoped_key_on_other_models(
    tmp_path: Path,
    pg_settings: PostgresSettings,
    topics: TopicSettings,
    lifecycle_env: None,
    keys: Keys,
) -> None:
    app, harness = gateway(tmp_path, pg_settings, topics, admin=True)
    _, infer = keys.new(Grant("infer"))
    _, fraud_only = keys.new(Grant("infer", frozenset({"fraud"})))
    with TestClient(app) as http:
        for route in app.routes:
            if not isinstance(route, APIRoute) or not route.path.startswith("/admin"):
                continue
            if route_permission(route)[1] not in (Permission.DEPLOY, Permission.ADMIN):
                continue  # the reads: an infer key may read
            for method in route.methods:
                resp = http.request(
                    method,
                    concrete(route.path),
                    headers=infer,
                    json={} if method == "POST" else None,
                )
                assert resp.status_code == 403, f"{method} {route.path}: {resp.text}"
        assert http.get("/admin/models", headers=infer).status_code == 200
        assert (
            http.post("/v2/models/fraud/infer", headers=infer, json=features()).status_code == 200
        )
        ok = http.post("/v2/models/fraud/infer", headers=fraud_only, json=features())
        assert ok.status_code == 200, ok.text
        echo = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}]}
        denied = http.post("/v2/models/echo/infer", headers=fraud_only, json=echo)
        assert denied.status_code == 403
        assert denied.json()["code"] == "PERMISSION_DENIED"
    assert {r["model"] for r in harness.worker.published} == {"fraud"}


def test_a_revoked_key_is_refused_on_every_replica_within_5_s(
    tmp_path: Path, pg_settings: PostgresSettings, topics: TopicSettings, keys: Keys
) -> None:
    key_id, headers = keys.new(Grant("infer"))
    first, _ = gateway(tmp_path, pg_settings, topics)
    second, _ = gateway(tmp_path, pg_settings, topics)
    with TestClient(first) as one, TestClient(second) as two:
        replicas = (one, two)
        for http in replicas:
            assert http.get("/v2/models/fraud", headers=headers).status_code == 200
        keys.run(lambda store: store.revoke(key_id, revoked_by="local:it"))
        revoked_at = time.monotonic()
        for http in replicas:

            def refused(http: TestClient = http) -> bool:
                return http.get("/v2/models/fraud", headers=headers).status_code == 401

            wait_for(
                refused,
                timeout=REVOKED_WITHIN_S - (time.monotonic() - revoked_at),
                interval=0.05,
                what="the revoked key to be refused",
            )
        took = time.monotonic() - revoked_at
        assert took < REVOKED_WITHIN_S
        for http in replicas:
            answer = http.get("/v2/models/fraud", headers=headers)
            assert answer.json()["detail"] == "the API key is revoked"


def test_jwts_from_the_issuer_are_accepted_and_bad_ones_refused(
    tmp_path: Path, pg_settings: PostgresSettings, topics: TopicSettings
) -> None:
    issuer = Issuer()
    try:
        app, _ = gateway(
            tmp_path,
            pg_settings,
            topics,
            jwt_issuer=ISSUER,
            jwt_audience=AUDIENCE,
            jwt_jwks_url=issuer.jwks_url,
            jwt_jwks_min_refresh_s=0,
        )
        with TestClient(app) as http:
            valid = http.post(
                "/v2/models/fraud/infer", headers=bearer(issuer.token()), json=features()
            )
            assert valid.status_code == 200, valid.text
            expired = http.get("/v2/models/fraud", headers=bearer(issuer.token(expires_in=-120)))
            assert expired.status_code == 401
            assert expired.json()["detail"] == "the bearer token has expired"
            forged_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            forged = http.get("/v2/models/fraud", headers=bearer(issuer.token(key=forged_key)))
            assert forged.status_code == 401
            new_kid = issuer.rotate()
            rotated = http.get("/v2/models/fraud", headers=bearer(issuer.token(kid=new_kid)))
            assert rotated.status_code == 200, rotated.text
    finally:
        issuer.close()


def test_the_recorded_actor_is_the_identity_whatever_x_tidegate_actor_says(
    tmp_path: Path,
    pg_settings: PostgresSettings,
    topics: TopicSettings,
    lifecycle_env: None,
    keys: Keys,
) -> None:
    async def seed(store: KeyStore) -> None:
        events = [
            ev.NewEvent(p, actor="it") for p in served("1", "2", primary="1", signature=FRAUD)
        ]
        await EventStore(store.pool).append("fraud", events, expected_version=0)

    keys.run(seed)
    key_id, deployer = keys.new(Grant("deploy", frozenset({"fraud"})))
    app, _ = gateway(tmp_path, pg_settings, topics, admin=True)
    with TestClient(app) as http:
        resp = http.post(
            "/admin/models/fraud/promote",
            headers={**deployer, "X-Tidegate-Actor": "security-team"},
            json={"version": "2", "force": True},
        )
        assert resp.status_code == 200, resp.text
        assert {e["actor"] for e in resp.json()["events"]} == {f"key:{key_id}"}
        history = http.get("/admin/models/fraud/history", headers=deployer).json()
        assert history[-1]["actor"] == f"key:{key_id}"
        assert "security-team" not in json.dumps(history)


def test_the_cli_issues_lists_expires_and_revokes_keys_each_change_audited(
    tmp_path: Path,
    pg_settings: PostgresSettings,
    topics: TopicSettings,
    monkeypatch: pytest.MonkeyPatch,
    new_topic: Any,
    kafka_settings: KafkaSettings,
    registry_settings: SchemaRegistrySettings,
) -> None:
    audit_topic = new_topic("it-audit")
    with RegistryHttp(registry_settings) as registry:
        list(register_all(registry, {f"{audit_topic}-value": AUDIT_EVENT}))
    monkeypatch.setenv("TIDEGATE_POSTGRES_DB_SCHEMA", pg_settings.db_schema)
    monkeypatch.setenv("TIDEGATE_TOPICS_AUDIT", audit_topic)
    monkeypatch.setenv(ACTOR_ENV, "before")  # what `--as` sets is undone afterwards
    runner = CliRunner()
    name = unique("ops")
    args = ["--as", name, "auth", "keys", "create", "ci", "--role", "infer:fraud"]
    created = runner.invoke(cli_app, [*args, "--tenant", "acme", "--json"])
    assert created.exit_code == 0, created.output
    made = json.loads(created.stdout)
    assert made["created_by"] == f"local:{name}"
    assert made["tenant"] == "acme"
    assert made["grants"] == [{"role": "infer", "models": ["fraud"]}]
    app, _ = gateway(tmp_path, pg_settings, topics, revocation_s=0.5)
    with TestClient(app) as http:
        assert http.get("/v2/models/fraud", headers=bearer(made["key"])).status_code == 200
        listed = runner.invoke(cli_app, ["auth", "keys", "list", "--json"])
        assert listed.exit_code == 0, listed.output
        assert made["key"] not in listed.stdout
        assert [k["id"] for k in json.loads(listed.stdout)] == [made["id"]]
        expired = runner.invoke(
            cli_app, ["--as", name, "auth", "keys", "expire", made["id"], "--at", "now"]
        )
        assert expired.exit_code == 0, expired.output
        wait_for(
            lambda: http.get("/v2/models/fraud", headers=bearer(made["key"])).status_code == 401,
            timeout=REVOKED_WITHIN_S,
            what="the expired key to be refused",
        )
        revoked = runner.invoke(cli_app, ["--as", name, "auth", "keys", "revoke", made["id"]])
        assert revoked.exit_code == 0, revoked.output
        listed = runner.invoke(cli_app, ["auth", "keys", "list", "--json"])
        assert json.loads(listed.stdout)[0]["state"] == "revoked"
    with AuditReader(kafka_settings, TopicSettings(audit=audit_topic), registry_settings) as read:

        def both() -> list[dict[str, Any]] | None:
            found = read.read(AuditFilter(actor=f"local:{name}"))
            return found if len(found) == 3 else None

        entries = wait_for(
            both,
            timeout=30,
            what="the three key changes in the audit trail",
        )
    assert [(e["action"], e["outcome"], e["target"]) for e in entries] == [
        ("keys.create", "success", f"key:{made['id']}"),
        ("keys.expire", "success", f"key:{made['id']}"),
        ("keys.revoke", "success", f"key:{made['id']}"),
    ]
    assert made["key"] not in json.dumps(entries, default=str)


def test_the_gateways_admin_actions_and_refused_credentials_are_in_the_audit_log(
    tmp_path: Path,
    pg_settings: PostgresSettings,
    topics: TopicSettings,
    lifecycle_env: None,
    keys: Keys,
    new_topic: Any,
    kafka_settings: KafkaSettings,
    registry_settings: SchemaRegistrySettings,
) -> None:
    audit_topic = new_topic("it-gw-audit")
    with RegistryHttp(registry_settings) as registry:
        list(register_all(registry, {f"{audit_topic}-value": AUDIT_EVENT}))
    audited = TopicSettings(audit=audit_topic)

    async def seed(store: KeyStore) -> None:
        events = [
            ev.NewEvent(p, actor="it") for p in served("1", "2", primary="1", signature=FRAUD)
        ]
        await EventStore(store.pool).append("fraud", events, expected_version=0)

    keys.run(seed)
    deploy_id, deployer = keys.new(Grant("deploy"))
    infer_id, inferrer = keys.new(Grant("infer"))
    app, harness = gateway(tmp_path, pg_settings, topics, admin=True)
    harness.services.audit = KafkaAuditTrail(
        kafka_settings, audited, registry_settings, service="gateway"
    )
    with TestClient(app) as http:
        promoted = http.post(
            "/admin/models/fraud/promote", headers=deployer, json={"version": "2", "force": True}
        )
        assert promoted.status_code == 200, promoted.text
        refused = http.post(
            "/admin/models/fraud/pin", headers=deployer, json={"version": "9", "tenant": "t"}
        )
        assert refused.status_code >= 400
        assert http.post("/admin/models/fraud/retire", headers=inferrer, json={}).status_code == 403
        assert http.get("/admin/models", headers=bearer("tg_0000_nope")).status_code == 401
        assert http.get("/admin/models").status_code == 401
    with AuditReader(kafka_settings, audited, registry_settings) as read:

        def all_five() -> list[dict[str, Any]] | None:
            found = read.read(AuditFilter())
            return found if len(found) >= 5 else None

        entries = wait_for(all_five, timeout=30, what="the gateway's audit entries")
    seen = {(e["actor"], e["action"].split(".")[0], e["outcome"]) for e in entries}
    assert (f"key:{deploy_id}", "lifecycle", "success") in seen  # the promotion
    assert (f"key:{deploy_id}", "lifecycle", "failure") in seen or (
        f"key:{deploy_id}",
        "lifecycle",
        "denied",
    ) in seen  # the refused pin
    assert (f"key:{infer_id}", "auth", "denied") in seen  # 403 on /retire
    failures = [e for e in entries if e["action"] == "auth.failed"]
    assert len(failures) == 2  # a wrong key and no credentials at all
    assert all(e["source"] for e in entries), "where each call came from"
    assert "tg_0000_nope" not in json.dumps(entries, default=str)


def test_key_expiry_is_written_and_judged_by_the_database_clock(keys: Keys) -> None:
    async def go(store: KeyStore) -> tuple[KeyRecord | None, KeyRecord | None, KeyRecord | None]:
        soon = await store.create("it", (Grant("infer"),), created_by="local:it")
        later = await store.create("it", (Grant("infer"),), created_by="local:it")
        await asyncio.sleep(0.01)
        with pytest.raises(ValueError, match="names no model"):
            await store.create("it", (Grant("infer", frozenset()),), created_by="local:it")
        return (
            await store.expire(soon.record.id),  # now(): expired at once
            await store.expire(later.record.id, timedelta(hours=1)),  # now() + 1 h
            await store.get(later.record.id),
        )

    expired, extended, read = keys.run(go)
    assert expired is not None
    assert expired.state() == "expired"
    assert expired.expires_in_s is not None
    assert expired.expires_in_s <= 0
    assert extended is not None
    assert read is not None
    assert read.state() == "active"
    assert read.expires_in_s is not None
    assert 3590 < read.expires_in_s <= 3600


def test_migration_0007_rolls_back_and_applies_again(pg_settings: PostgresSettings) -> None:
    def state() -> tuple[bool, str]:
        with psycopg.connect(pg_settings.conninfo()) as conn:
            row = conn.execute(
                "SELECT to_regclass('api_keys') IS NOT NULL, (SELECT value FROM tidegate_meta"
                " WHERE key = 'schema_version')"
            ).fetchone()
        assert row is not None
        return bool(row[0]), str(row[1])

    assert state() == (True, "9")
    migrations = read_migrations(str(MIGRATIONS_DIR)).filter(lambda m: m.id >= "0007_api_keys")
    url = f"{pg_settings.url()}?schema={pg_settings.db_schema}"
    with get_backend(url) as backend, backend.lock():
        backend.rollback_migrations(backend.to_rollback(migrations))
    assert state() == (False, "6")
    assert {"0007_api_keys", "0008_key_tenant", "0009_key_routing_key"} <= set(migrate(pg_settings))
    assert state() == (True, "9")


def test_a_keys_tenant_is_kept_and_becomes_its_identitys(keys: Keys) -> None:
    async def go(store: KeyStore) -> tuple[KeyRecord | None, KeyRecord | None]:
        scoped = await store.create("it", (Grant("infer"),), created_by="local:it", tenant="acme")
        plain = await store.create("it", (Grant("infer"),), created_by="local:it")
        return await store.get(scoped.record.id), await store.get(plain.record.id)

    scoped, plain = keys.run(go)
    assert scoped is not None
    assert plain is not None
    assert (scoped.tenant, scoped.identity().tenant, scoped.view()["tenant"]) == ("acme",) * 3
    assert (plain.tenant, plain.identity().tenant) == (None, None)


def test_a_keys_routing_key_is_kept_and_becomes_its_identitys(keys: Keys) -> None:
    async def go(store: KeyStore) -> tuple[KeyRecord | None, KeyRecord | None]:
        bound = await store.create(
            "it", (Grant("infer"),), created_by="local:it", routing_key="card-42"
        )
        plain = await store.create("it", (Grant("infer"),), created_by="local:it")
        return await store.get(bound.record.id), await store.get(plain.record.id)

    bound, plain = keys.run(go)
    assert bound is not None
    assert plain is not None
    assert (bound.routing_key, bound.identity().routing_key) == ("card-42", "card-42")
    assert bound.view()["routing_key"] == "card-42"
    assert (plain.routing_key, plain.identity().routing_key) == (None, None)
