"""Projections: written inside every append, rebuilt from the events alone, equal to `fold`."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.domain.state import ModelState
from tidegate.lifecycle.domain.views import Routing
from tidegate.lifecycle.eventstore import projections
from tidegate.lifecycle.eventstore.event_store import EventStore
from tidegate.lifecycle.eventstore.projections import Projections

Pool = AsyncConnectionPool[Any]


def registered(version: str, runtime: str = "onnx") -> ev.ModelRegistered:
    return ev.ModelRegistered(
        version, runtime, f"file:///models/{version}", {"model.onnx": f"sha-{version}"}
    )


FRAUD: list[ev.Payload] = [
    registered("v1"),
    ev.ArtifactValidated("v1", load_ms=40.0, device="cpu"),
    ev.VersionLoaded("v1", "w1", 35.0),
    ev.VersionLoaded("v1", "w2", 38.0),
    ev.Promoted("v1"),
    registered("v2"),
    ev.ArtifactValidated("v2", load_ms=41.0),
    ev.ShadowStarted("v2", sample_rate=0.25),
    ev.VersionLoaded("v2", "w1", 30.0),
    ev.ShadowStopped("v2", reason="enough samples"),
    ev.CanaryStarted("v2", [10, 50, 100], dwell_s=30.0, thresholds={"max_error_rate": 0.05}),
    ev.TrafficShifted({"v1": 90, "v2": 10}, reason="canary step 10"),
    ev.TrafficShifted({"v1": 50, "v2": 50}, reason="canary step 50"),
    ev.RolledBack("v2", "error rate 0.2 > 0.05", {"candidate_error_rate": 0.2}, "v1"),
    ev.RoutingRuleSet("pin-acme", tenant="acme", version="v1"),
    ev.RoutingRuleSet("exp-1", tenant="beta", weights={"v1": 70, "v2": 30}),
    registered("v3"),
    ev.ValidationFailed("v3", reason="checksum mismatch"),
    ev.RoutingRuleSet("exp-1"),
    ev.Retired("v2"),
    ev.VersionUnloaded("v2", "w1", reason="retired"),
]

MINILM: list[ev.Payload] = [
    registered("1", "torch"),
    ev.ArtifactValidated("1"),
    ev.VersionLoaded("1", "w1"),
    ev.Promoted("1"),
    registered("2", "torch"),
    ev.ArtifactValidated("2"),
    ev.CanaryStarted("2", [100], dwell_s=5.0),
    ev.VersionLoaded("2", "w2"),
    ev.TrafficShifted({"2": 100}, reason="blue-green"),
    ev.Promoted("2", forced=True, previous="1", agreement=0.7),
    ev.VersionUnloaded("1", "w1", reason="lru"),
    ev.Retired("1"),
    ev.RoutingRuleSet("pin-old", tenant="legacy", version="2"),
]


async def append_all(store: EventStore, model: str, payloads: Sequence[ev.Payload]) -> None:
    """One event per append, with the expected version, as the commands append them."""
    correlation = uuid.uuid4()
    for i, payload in enumerate(payloads):
        await store.append(
            model,
            [ev.NewEvent(payload, actor=f"op{i % 3}", correlation_id=correlation)],
            expected_version=i,
        )


async def interleaved(store: EventStore) -> None:
    """Both models' lifecycles, their appends interleaved as concurrent operators would."""
    longest = max(len(FRAUD), len(MINILM))
    for i in range(longest):
        for model, payloads in (("fraud", FRAUD), ("minilm", MINILM)):
            if i < len(payloads):
                await store.append(
                    model, [ev.NewEvent(payloads[i], actor="op")], expected_version=i
                )


def assert_routing_is_fold(routing: Routing | None, state: ModelState) -> None:
    assert routing is not None
    assert routing.model.sequence == state.sequence
    assert routing.model.primary == state.primary
    assert routing.model.previous_primary == state.previous_primary
    assert routing.model.updated_at == state.updated_at
    assert (routing.model.canary.version if routing.model.canary else None) == (
        state.canary.version if state.canary else None
    )
    assert {v.version: v.status for v in routing.versions} == {
        v.version: v.status.value for v in state.versions
    }
    intended = {v.version: v.weight for v in routing.versions if v.weight}
    assert intended == state.intended_weights()
    effective = {v.version: v.effective_weight for v in routing.versions if v.effective_weight}
    assert effective == state.effective_weights()
    assert routing.shadows() == {
        v.version: v.shadow_rate for v in state.versions if v.shadow_rate is not None
    }
    assert {v.version: set(v.loaded_on) for v in routing.versions} == {
        v.version: set(v.loaded_on) for v in state.versions
    }
    assert [(r.rule_id, r.tenant, r.version, r.weights) for r in routing.rules] == [
        (r.rule_id, r.tenant, r.version, dict(r.weights)) for r in state.rules
    ]


async def truncate_projections(pool: Pool) -> None:
    async with pool.connection() as conn:
        await conn.execute(
            sql.SQL("TRUNCATE {}").format(
                sql.SQL(", ").join(map(sql.Identifier, projections.TABLES))
            )
        )


async def test_rebuilt_projections_equal_the_live_ones(pg_pool: Pool) -> None:
    store = EventStore(pg_pool)
    views = Projections(pg_pool)
    await interleaved(store)

    live = await views.snapshot()
    assert len(live["version_history"]) == len(FRAUD) + len(MINILM)
    assert {row[0] for row in live["lifecycle_models"]} == {"fraud", "minilm"}

    await truncate_projections(pg_pool)
    emptied = await views.snapshot()
    assert all(rows == [] for rows in emptied.values())
    assert await views.routing("fraud") is None

    assert await views.rebuild() == 2
    assert await views.snapshot() == live
    # A rebuild over intact projections changes nothing either.
    assert await views.rebuild() == 2
    assert await views.snapshot() == live


async def test_projections_equal_the_fold_of_the_events(pg_pool: Pool) -> None:
    store = EventStore(pg_pool)
    views = Projections(pg_pool)
    await append_all(store, "fraud", FRAUD)
    await append_all(store, "minilm", MINILM)

    for model in ("fraud", "minilm"):
        state = await store.load(model)
        assert_routing_is_fold(await views.routing(model), state)
    summaries = await views.models()
    assert [(m.model, m.primary) for m in summaries] == [("fraud", "v1"), ("minilm", "2")]

    fraud = await views.routing("fraud")
    assert fraud is not None
    assert {v.version: v.status for v in fraud.versions} == {
        "v1": "validated",
        "v2": "retired",
        "v3": "failed",
    }
    assert {v.version: v.effective_weight for v in fraud.versions} == {"v1": 100, "v2": 0, "v3": 0}
    assert [(r.rule_id, r.tenant, r.version) for r in fraud.rules] == [("pin-acme", "acme", "v1")]
    minilm = await views.routing("minilm")
    assert minilm is not None
    assert minilm.model.previous_primary is None  # "1" was retired
    assert {v.version: v.ready for v in minilm.versions} == {"1": False, "2": True}


async def test_history_and_lineage(pg_pool: Pool) -> None:
    store = EventStore(pg_pool)
    views = Projections(pg_pool)
    await append_all(store, "fraud", FRAUD)
    await append_all(store, "minilm", MINILM)
    events = await store.read("fraud")

    history = await views.history("fraud")
    assert [h.sequence for h in history] == [e.sequence for e in events]
    assert [h.type for h in history] == [e.type for e in events]
    assert [h.occurred_at for h in history] == [e.occurred_at for e in events]
    assert history[13].summary == "rolled back v2 to v1: error rate 0.2 > 0.05"
    assert history[13].payload["metrics"] == {"candidate_error_rate": 0.2}
    assert [h.sequence for h in await views.history("fraud", limit=2)] == [20, 21]

    v2 = await views.lineage("fraud", "v2")
    assert v2 is not None
    by_type = {e.type: e for e in events if getattr(e.payload, "version", None) == "v2"}
    assert v2.registered_at == by_type["ModelRegistered"].occurred_at
    assert v2.registered_by == by_type["ModelRegistered"].actor
    assert v2.sha256 == {"model.onnx": "sha-v2"}
    assert v2.validated_at == by_type["ArtifactValidated"].occurred_at
    assert v2.shadow_started_at == by_type["ShadowStarted"].occurred_at
    assert v2.canary_started_at == by_type["CanaryStarted"].occurred_at
    assert v2.rolled_back_at == by_type["RolledBack"].occurred_at
    assert v2.rollback_reason == "error rate 0.2 > 0.05"
    assert v2.retired_at == by_type["Retired"].occurred_at
    assert v2.promoted_at is None
    assert v2.correlation_ids == [events[0].correlation_id]

    v3 = await views.lineage("fraud", "v3")
    assert v3 is not None
    assert v3.failure_reason == "checksum mismatch"
    assert v3.validated_at is None
    forced = await views.lineage("minilm", "2")
    assert forced is not None
    assert forced.promoted_forced is True
    assert forced.promoted_by is not None
    assert [lin.version for lin in await views.lineages("fraud")] == ["v1", "v2", "v3"]
    assert await views.lineage("fraud", "v9") is None
