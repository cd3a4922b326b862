"""The example models in the real store (`tidegate models build`, var/models), served by the real
runtimes: fraud's ONNX and TorchScript agree, v2 differs a little, v3 fails a fifth of its
inputs, minilm embeds paraphrases closer than unrelated texts."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from tidegate.cli.model_commands import app
from tidegate.core.errors import ModelExecutionError
from tidegate.examples import build_models
from tidegate.examples.fraud import FAULT_BELOW, TRAIN_ROWS, dataset
from tidegate.models.model_settings import ModelSettings
from tidegate.models.runtime import load_package
from tidegate.models.runtime.contract import ModelRuntime
from tidegate.models.store import LocalArtifactStore

REPO = Path(__file__).resolve().parents[3]
EXPECTED = {
    ("fraud", "1"),
    ("fraud", "1-torch"),
    ("fraud", "2"),
    ("fraud", "3"),
    ("fraud-lite", "1"),
    ("minilm", "1"),
}


@pytest.fixture(scope="session")
def settings() -> ModelSettings:
    settings = ModelSettings()
    if not settings.store_dir.is_absolute():
        settings = settings.model_copy(update={"store_dir": REPO / settings.store_dir})
    return settings


@pytest.fixture(scope="session")
def store(settings: ModelSettings) -> LocalArtifactStore:
    """The real store, built here if `make models` has not run (a no-op when it has)."""
    store = LocalArtifactStore(settings)
    outcomes = asyncio.run(build_models(store))
    assert {(o.manifest.name, o.manifest.version) for o in outcomes} == EXPECTED
    return store


async def _load(store: LocalArtifactStore, settings: ModelSettings, name: str, version: str) -> Any:
    return await load_package(store, name, version, settings)


def _test_rows(count: int) -> np.ndarray[Any, np.dtype[np.float32]]:
    features, _ = dataset(TRAIN_ROWS + 4000)
    return np.ascontiguousarray(features[TRAIN_ROWS : TRAIN_ROWS + count])


async def test_a_second_build_skips_everything(store: LocalArtifactStore) -> None:
    before = {key: await store.manifest(*key) for key in EXPECTED}
    outcomes = await build_models(store)
    assert {o.action for o in outcomes} == {"skipped"}
    assert sum(o.seconds for o in outcomes) < 10
    assert {(o.manifest.name, o.manifest.version): o.manifest for o in outcomes} == before


async def test_fraud_onnx_and_torchscript_agree(
    store: LocalArtifactStore, settings: ModelSettings
) -> None:
    batch = _test_rows(256)
    onnx: ModelRuntime = await _load(store, settings, "fraud", "1")
    torch: ModelRuntime = await _load(store, settings, "fraud", "1-torch")
    assert (onnx.device, torch.device) == ("cpu", "cpu")
    from_onnx = (await onnx.infer({"features": batch}))["probabilities"]
    from_torch = (await torch.infer({"features": batch}))["probabilities"]
    assert from_onnx.shape == (256, 2)
    np.testing.assert_allclose(from_onnx, from_torch, atol=1e-5)
    np.testing.assert_allclose(from_onnx.sum(axis=1), 1.0, atol=1e-5)
    for runtime in (onnx, torch):
        await runtime.on_unload()


async def test_fraud_versions_mostly_agree_and_lite_is_weaker(
    store: LocalArtifactStore, settings: ModelSettings
) -> None:
    features, labels = dataset(TRAIN_ROWS + 4000)
    batch, truth = np.ascontiguousarray(features[TRAIN_ROWS:]), labels[TRAIN_ROWS:]
    predicted = {}
    for name, version in [("fraud", "1"), ("fraud", "2"), ("fraud-lite", "1")]:
        runtime: ModelRuntime = await _load(store, settings, name, version)
        probabilities = (await runtime.infer({"features": batch}))["probabilities"]
        predicted[name, version] = probabilities.argmax(axis=1)
        await runtime.on_unload()
    agreement = float((predicted["fraud", "1"] == predicted["fraud", "2"]).mean())
    assert 0.9 < agreement < 1.0
    accuracy = {key: float((p == truth).mean()) for key, p in predicted.items()}
    assert accuracy["fraud", "1"] > 0.93
    assert accuracy["fraud", "2"] > 0.93
    assert 0.8 < accuracy["fraud-lite", "1"] < accuracy["fraud", "1"]


async def test_fraud_v3_fails_about_a_fifth_of_its_inputs(
    store: LocalArtifactStore, settings: ModelSettings
) -> None:
    rows = _test_rows(200)
    faulty: ModelRuntime = await _load(store, settings, "fraud", "3")
    healthy: ModelRuntime = await _load(store, settings, "fraud", "1")
    failures: list[tuple[float, str]] = []
    for row in rows:
        single = row[np.newaxis, :]
        try:
            got = (await faulty.infer({"features": single}))["probabilities"]
        except ModelExecutionError as exc:
            failures.append((float(row[0]), str(exc)))
            continue
        expected = (await healthy.infer({"features": single}))["probabilities"]
        np.testing.assert_allclose(got, expected, atol=1e-5)
    message = f"RuntimeError: fraud v3 fault: 1 row(s) have features[0] < {FAULT_BELOW}"
    assert all(first < FAULT_BELOW and text == message for first, text in failures), failures
    assert 0.12 < len(failures) / len(rows) < 0.28
    for runtime in (faulty, healthy):
        await runtime.on_unload()


async def test_minilm_embeds_paraphrases_closer_than_unrelated_texts(
    store: LocalArtifactStore, settings: ModelSettings
) -> None:
    runtime: ModelRuntime = await _load(store, settings, "minilm", "1")
    texts = [
        "How do I reset my password?",
        "What are the steps to change my login password?",
        "The recipe needs two cups of flour and a pinch of salt.",
    ]
    array = np.empty(len(texts), dtype=object)
    array[:] = [t.encode() for t in texts]
    embedding = (await runtime.infer({"text": array}))["embedding"]
    assert embedding.shape == (3, 384)
    assert embedding.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(embedding, axis=1), 1.0, atol=1e-5)
    paraphrase, unrelated = float(embedding[0] @ embedding[1]), float(embedding[0] @ embedding[2])
    assert paraphrase > 0.6
    assert paraphrase > unrelated + 0.4
    await runtime.on_unload()


def test_cli_builds_deterministically_and_lists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIDEGATE_MODELS_STORE_DIR", str(tmp_path / "store"))
    runner = CliRunner()
    first = runner.invoke(app, ["build", "--only", "fraud-lite"])
    assert first.exit_code == 0, first.output
    assert "built" in first.output
    # Rebuilt from scratch, the ONNX artifact is byte for byte the same.
    again = runner.invoke(app, ["build", "--only", "fraud-lite", "--force"])
    assert again.exit_code == 0, again.output
    assert "unchanged" in again.output
    listed = runner.invoke(app, ["artifacts"])
    assert listed.exit_code == 0, listed.output
    assert "fraud-lite" in listed.output
    unknown = runner.invoke(app, ["build", "--only", "nope"])
    assert unknown.exit_code == 1
    assert "no example model 'nope'" in unknown.output
