"""Online feature enrichment against the real Kafka, schema registry, PostgreSQL and Redis, with
the real fraud model (`examples/`, fraud 1: 64 FP32 features): requests naming an entity get the
same outputs as the same features sent inline, record when the features were written, and a
missing entity is answered INVALID_INPUT. The entities are written with `tidegate features put`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from redis.asyncio import Redis
from typer.testing import CliRunner

from tests.integration.conftest import REPO
from tests.integration.workers import Reader, Stack, in_thread, publish
from tests.support import unique
from tidegate.agents.assembly import WorkerConfig, running_worker
from tidegate.agents.inference.loaded import LoadedModel, store_loader
from tidegate.agents.stages.feature_settings import FeatureSettings
from tidegate.agents.worker_settings import WorkerSettings
from tidegate.cli.features_commands import app as features_cli
from tidegate.core.settings import RedisSettings
from tidegate.dlq.failure_settings import FailureSettings
from tidegate.examples import build_models
from tidegate.lifecycle.domain import events as ev
from tidegate.models.model_settings import ModelSettings
from tidegate.models.store import LocalArtifactStore
from tidegate.schemas.requests import build_request
from tidegate.schemas.tensors import to_numpy

NAMES = tuple(f"f{i:02d}" for i in range(64))
ROWS = 6
WRITTEN_AT = 1_767_225_600_123  # 2026-01-01T00:00:00.123Z


@pytest.fixture(scope="module")
def fraud_models() -> ModelSettings:
    """The real store, with the example fraud versions built (once; later runs reuse them)."""
    settings = ModelSettings(store_dir=REPO / "var" / "models")
    asyncio.run(build_models(LocalArtifactStore(settings), only=["fraud"]))
    return settings


@pytest.fixture
def features() -> FeatureSettings:
    return FeatureSettings(declared={"fraud": {"features": NAMES}}, key_prefix=f"{unique('feat')}:")


@pytest.fixture
def env(features: FeatureSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    """`tidegate features` reads its settings from the environment, as an operator runs it."""
    monkeypatch.setenv("TIDEGATE_FEATURES_KEY_PREFIX", features.key_prefix)
    monkeypatch.setenv("TIDEGATE_FEATURES_DECLARED", json.dumps({"fraud": {"features": NAMES}}))


@pytest.fixture
async def redis(features: FeatureSettings) -> AsyncIterator[Redis]:
    client = Redis.from_url(RedisSettings().url)
    yield client
    keys = [key async for key in client.scan_iter(match=f"{features.key_prefix}*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


def put_row(entity: str, row: npt.NDArray[np.float32]) -> None:
    # float64 text of each float32 value: exact, so the worker rebuilds the same float32 row.
    values = ",".join(repr(float(v)) for v in row)
    result = CliRunner().invoke(
        features_cli, ["put", entity, "--model", "fraud", "--row", values, "--at", str(WRITTEN_AT)]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["updated_at"] == WRITTEN_AT


async def register_fraud(stack: Stack, fraud: ModelSettings) -> None:
    store = LocalArtifactStore(fraud)
    manifest = await store.manifest("fraud", "1")
    await stack.append(
        ev.ModelRegistered(
            "1",
            "onnx",
            f"file://{store.package_dir('fraud', '1')}",
            dict(manifest.files),
            signature_json=manifest.signature.model_dump_json(),
        ),
        ev.ArtifactValidated("1"),
        ev.Promoted("1"),
        model="fraud",
    )


def fraud_request(rid: str, entity: str | None, row: npt.NDArray[np.float32] | None) -> Any:
    inputs = {"features": row.reshape(1, 64)} if row is not None else {}
    return build_request("fraud", inputs, request_id=rid, routing_key=rid, entity_key=entity)


async def test_enriched_requests_match_inline_features_and_missing_entities_are_invalid(
    stack: Stack,
    models: ModelSettings,
    fraud_models: ModelSettings,
    features: FeatureSettings,
    env: None,
    redis: Redis,
) -> None:
    await register_fraud(stack, fraud_models)
    rows = np.random.default_rng(7).standard_normal((ROWS, 64)).astype(np.float32)
    for i, row in enumerate(rows):
        await in_thread(put_row, f"card-{i}", row)  # the command runs its own event loop
    sent = [
        *(fraud_request(f"entity-{i}", f"card-{i}", None) for i in range(ROWS)),
        *(fraud_request(f"inline-{i}", None, row) for i, row in enumerate(rows)),
        fraud_request("ghost", "card-never-written", None),
    ]
    publish(stack, sent)
    tiny, fraud = store_loader(models), store_loader(fraud_models)

    async def loader(name: str, version: str) -> LoadedModel:
        return await (fraud if name == "fraud" else tiny)(name, version)

    config = WorkerConfig(
        worker=WorkerSettings(group_id=stack.group, worker_id="it", metrics_port=0),
        kafka=stack.kafka,
        topics=stack.topics,
        models=fraud_models,
        registry=stack.registry,
        postgres=stack.pg,
        failure=FailureSettings(crash_guard=False),
        features=features,
    )
    results = Reader(stack, stack.topics.results)
    async with running_worker(config, loader=loader):
        got = {r["request_id"]: r for r in await in_thread(results.until, len(sent), 120.0)}
    results.close()

    ghost = got.pop("ghost")
    assert ghost["status"] == "INVALID"
    assert ghost["error"]["code"] == "INVALID_INPUT"
    assert "card-never-written" in ghost["error"]["message"]
    assert ghost["features_at"] is None
    for i in range(ROWS):
        enriched, inline = got[f"entity-{i}"], got[f"inline-{i}"]
        assert enriched["status"] == inline["status"] == "OK", enriched["error"]
        assert enriched["model_version"] == "1"
        np.testing.assert_allclose(
            to_numpy(enriched["outputs"][0]), to_numpy(inline["outputs"][0]), rtol=1e-6, atol=1e-7
        )
        assert enriched["features_at"] == datetime.fromtimestamp(WRITTEN_AT / 1000, UTC)
        assert inline["features_at"] is None
    stored = await in_thread(CliRunner().invoke, features_cli, ["get", "card-0"])
    assert stored.exit_code == 0, stored.output
    assert json.loads(stored.output)["_updated_at"] == str(WRITTEN_AT)
