"""The ONNX and torch runtimes on tiny models exported the way the example models are.

The real models are checked in tests/integration/test_models_build.py; here everything is built
in a temporary store in a few seconds.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import thread as futures_thread
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from prometheus_client import REGISTRY
from torch import nn

from tidegate.core.errors import (
    ArtifactError,
    ConfigurationError,
    InvalidInputError,
    ModelExecutionError,
    ModelUnavailableError,
)
from tidegate.examples.export import export_onnx, export_torchscript
from tidegate.models.manifest import Manifest
from tidegate.models.model_settings import ModelSettings
from tidegate.models.runtime import create_runtime, load_package
from tidegate.models.runtime.device import onnx_providers, torch_device
from tidegate.models.runtime.executor import ExecutorRuntime
from tidegate.models.runtime.onnx import OnnxRuntime
from tidegate.models.store import LocalArtifactStore
from tidegate.schemas.signature import Signature, TensorSpec

# Imports torch (tests/unit/conftest.py keeps the fast tier from collecting it).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def _signature(inputs: list[tuple[str, str, tuple[int, ...]]], outputs: list[Any]) -> Signature:
    return Signature(
        inputs=tuple(TensorSpec(name=n, datatype=d, shape=s) for n, d, s in inputs),
        outputs=tuple(TensorSpec(name=n, datatype=d, shape=s) for n, d, s in outputs),
    )


TINY = _signature([("x", "FP32", (-1, 8))], [("p", "FP32", (-1, 3))])
WORDS = _signature([("text", "BYTES", (-1,))], [("vector", "FP32", (-1, 4))])
VOCAB = ["[PAD]", "[UNK]", "hello", "world", "good", "morning", "all"]


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.layers(x), dim=1)


class FirstRowOnly(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(dim=0, keepdim=True)[:, :3]


class Boom(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x < 0).any()):
            raise RuntimeError("negative input in " + str(int((x < 0).sum())) + " cells")
        return x[:, :3]


class MeanEmbedding(nn.Module):
    """A BERT-shaped toy: token embeddings averaged over the attention mask."""

    def __init__(self) -> None:
        super().__init__()
        self.words = nn.Embedding(len(VOCAB), 4)
        self.types = nn.Embedding(2, 4)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        hidden: torch.Tensor = self.words(input_ids) + self.types(token_type_ids)
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)


def _tokenizer_file(path: Path) -> None:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    tokenizer = Tokenizer(WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]", length=32)  # the runtime overrides it
    tokenizer.save(str(path))


def _put(store: LocalArtifactStore, workdir: Path, **fields: Any) -> None:
    files = {p.name: "" for p in workdir.iterdir()}
    manifest = Manifest.model_validate({"files": files, **fields})
    asyncio.run(store.put(workdir, manifest))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> LocalArtifactStore:
    root = tmp_path_factory.mktemp("runtimes")
    store = LocalArtifactStore(ModelSettings(store_dir=root / "store"))
    torch.manual_seed(0)
    tiny = Tiny().eval()
    example = (torch.zeros(2, 8),)

    def package(name: str, version: str, build: Callable[[Path], str], **fields: Any) -> None:
        workdir = root / f"{name}-{version}"
        workdir.mkdir()
        entrypoint = build(workdir)
        runtime = "onnx" if entrypoint.endswith(".onnx") else "torch"
        fields = {"signature": TINY, "runtime": runtime, "entrypoint": entrypoint, **fields}
        _put(store, workdir, name=name, version=version, **fields)

    def onnx(module: nn.Module, out: str = "p") -> Callable[[Path], str]:
        def build(workdir: Path) -> str:
            axes = {"x": {0: "batch"}, out: {0: "batch"}}
            export_onnx(module, example, workdir / "model.onnx", ["x"], [out], axes)
            return "model.onnx"

        return build

    def script(module: nn.Module) -> Callable[[Path], str]:
        def build(workdir: Path) -> str:
            export_torchscript(module, workdir / "model.pt")
            return "model.pt"

        return build

    def exported(workdir: Path) -> str:
        program = torch.export.export(
            tiny, example, dynamic_shapes=({0: torch.export.Dim("batch")},)
        )
        torch.export.save(program, str(workdir / "model.pt2"))
        return "model.pt2"

    package("tiny", "onnx", onnx(tiny))
    package("tiny", "torch", script(tiny))
    package("tiny", "pt2", exported)
    package("rows", "onnx", onnx(FirstRowOnly()))
    package("rows", "torch", script(FirstRowOnly()))
    package("boom", "torch", script(Boom()))
    package("misnamed", "onnx", onnx(tiny, out="q"))

    workdir = root / "words"
    workdir.mkdir()
    _tokenizer_file(workdir / "tokenizer.json")
    ids = torch.tensor([[2, 3, 0]])
    names = ["input_ids", "attention_mask", "token_type_ids"]
    axes = {n: {0: "batch", 1: "sequence"} for n in names}
    export_onnx(
        MeanEmbedding().eval(),
        (ids, torch.ones_like(ids), torch.zeros_like(ids)),
        workdir / "model.onnx",
        names,
        ["pooled"],
        {**axes, "pooled": {0: "batch"}},
    )
    _put(
        store,
        workdir,
        name="words",
        version="1",
        runtime="onnx",
        entrypoint="model.onnx",
        signature=WORDS,
        preprocess={
            "kind": "tokenizer",
            "file": "tokenizer.json",
            "max_length": 4,
            "input": "text",
        },
        postprocess={"kind": "rename", "outputs": {"pooled": "vector"}},
    )
    return store


SETTINGS = ModelSettings(intra_op_threads=2, allow_pickled=True)
BATCH = np.random.default_rng(7).standard_normal((5, 8)).astype(np.float32)


async def test_onnx_torchscript_and_export_agree(store: LocalArtifactStore) -> None:
    outputs = {}
    for version in ("onnx", "torch", "pt2"):
        runtime = await load_package(store, "tiny", version, SETTINGS)
        assert runtime.device == "cpu"
        outputs[version] = (await runtime.infer({"x": BATCH}))["p"]
        assert outputs[version].shape == (5, 3)
        assert outputs[version].dtype == np.float32
        await runtime.on_unload()
    np.testing.assert_allclose(outputs["onnx"], outputs["torch"], atol=1e-5)
    np.testing.assert_allclose(outputs["onnx"], outputs["pt2"], atol=1e-5)
    np.testing.assert_allclose(outputs["onnx"].sum(axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("version", ["onnx", "torch", "pt2"])
async def test_a_version_loaded_before_the_heap_is_frozen_is_freed_when_unloaded(
    store: LocalArtifactStore, version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker freezes its heap with its start-up versions loaded (`tidegate.core.heap.settle`):
    # the cyclic collector never walks those objects again, so unloading one of them must free
    # it by reference counting alone, or its memory stays for the life of the process.
    runtime = await load_package(store, "tiny", version, SETTINGS)
    await runtime.infer({"x": BATCH})
    # A busy host can leave the runtime's thread descheduled right after a call, still holding
    # it (and the runtime) after the caller was answered: here it always is.
    run = futures_thread._WorkItem.run

    def run_then_stall(item: Any) -> None:
        run(item)
        time.sleep(0.3)

    monkeypatch.setattr(futures_thread._WorkItem, "run", run_then_stall)
    gc.collect()
    gc.freeze()
    try:
        gone = weakref.ref(runtime)
        await runtime.on_unload()
        del runtime
        assert gone() is None
    finally:
        gc.unfreeze()


async def test_onnx_sessions_take_the_configured_threads(store: LocalArtifactStore) -> None:
    runtime = await load_package(store, "tiny", "onnx", SETTINGS)
    assert isinstance(runtime, OnnxRuntime)
    options = runtime._session.get_session_options()
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (2, 1)
    await runtime.on_unload()


@pytest.mark.parametrize("version", ["onnx", "torch"])
async def test_outputs_must_have_a_row_per_input_row(
    store: LocalArtifactStore, version: str
) -> None:
    package = await store.fetch("rows", version)
    runtime = create_runtime(package.manifest, SETTINGS)
    await runtime.load(package)
    with pytest.raises(ModelExecutionError, match="output 'p' has 1 rows for a batch of 5"):
        await runtime.infer({"x": BATCH})
    await runtime.on_unload()
    # load_package warms up, so such a package is refused before it serves anything.
    with pytest.raises(ArtifactError, match=r"warm-up of rows version \w+ failed"):
        await load_package(store, "rows", version, SETTINGS)


async def test_warm_up_runs_one_synthetic_batch_in_the_runtime_thread(
    store: LocalArtifactStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, tuple[int, ...]]] = []
    compute = OnnxRuntime._compute

    def spy(self: OnnxRuntime, feeds: dict[str, Any]) -> dict[str, Any]:
        calls.append((threading.current_thread().name, feeds["x"].shape))
        return compute(self, feeds)

    monkeypatch.setattr(OnnxRuntime, "_compute", spy)
    never_inline = SETTINGS.model_copy(update={"inline_below_ms": 0.0})
    runtime = await load_package(store, "tiny", "onnx", never_inline)
    assert calls == [(calls[0][0], (ExecutorRuntime.warmup_rows, 8))]
    await runtime.infer({"x": BATCH})
    await runtime.infer({"x": BATCH[:1]})
    threads = {name for name, _ in calls}
    assert len(threads) == 1
    assert threads.pop().startswith("model-tiny version onnx")
    await runtime.on_unload()


async def test_a_model_faster_than_a_thread_hop_runs_inline_and_a_slow_one_goes_back(
    store: LocalArtifactStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[str] = []
    compute = OnnxRuntime._compute
    slow = False

    def spy(self: OnnxRuntime, feeds: dict[str, Any]) -> dict[str, Any]:
        threads.append(threading.current_thread().name)
        if slow:
            time.sleep(0.05)
        return compute(self, feeds)

    monkeypatch.setattr(OnnxRuntime, "_compute", spy)
    runtime = await load_package(
        store, "tiny", "onnx", SETTINGS.model_copy(update={"inline_below_ms": 20.0})
    )
    assert threads[0].startswith("model-tiny"), "the warm-up ran inline: nothing was measured"
    for _ in range(3):
        await runtime.infer({"x": BATCH})
    assert threads[-1] == threading.current_thread().name, "a fast model still hops threads"
    slow = True
    for _ in range(10):
        await runtime.infer({"x": BATCH})
    assert threads[-1].startswith("model-tiny"), "a slow model kept blocking the event loop"
    await runtime.on_unload()


async def test_a_graph_that_does_not_match_its_signature_is_refused(
    store: LocalArtifactStore,
) -> None:
    with pytest.raises(ArtifactError, match="gave no output 'p'; it gave \\['q'\\]"):
        await load_package(store, "misnamed", "onnx", SETTINGS)


async def test_model_errors_keep_the_original_message(store: LocalArtifactStore) -> None:
    runtime = await load_package(store, "boom", "torch", SETTINGS)
    assert (await runtime.infer({"x": np.abs(BATCH)}))["p"].shape == (5, 3)
    with pytest.raises(ModelExecutionError) as caught:
        await runtime.infer({"x": -np.abs(BATCH[:2])})
    assert str(caught.value) == "RuntimeError: negative input in 16 cells"
    assert caught.value.code == "MODEL_ERROR"
    await runtime.on_unload()

    onnx = await load_package(store, "tiny", "onnx", SETTINGS)
    with pytest.raises(ModelExecutionError) as caught:
        await onnx.infer({"x": BATCH.astype(np.float64)})
    cause = caught.value.__cause__
    assert cause is not None
    assert str(caught.value) == str(cause)
    assert "double" in str(caught.value)
    await onnx.on_unload()


async def test_unloaded_runtimes_and_ragged_batches_are_refused(
    store: LocalArtifactStore,
) -> None:
    package = await store.fetch("tiny", "onnx")
    runtime = create_runtime(package.manifest, SETTINGS)
    with pytest.raises(ModelUnavailableError):
        await runtime.infer({"x": BATCH})
    await runtime.load(package)
    with pytest.raises(InvalidInputError, match="disagree on the batch size"):
        await runtime.infer({"x": BATCH, "y": BATCH[:2]})
    await runtime.on_unload()
    with pytest.raises(ModelUnavailableError):
        await runtime.infer({"x": BATCH})


async def test_texts_are_tokenized_inside_the_runtime(store: LocalArtifactStore) -> None:
    runtime = await load_package(store, "words", "1", SETTINGS)

    async def embed(*texts: bytes) -> np.ndarray[Any, Any]:
        array = np.empty(len(texts), dtype=object)
        array[:] = list(texts)
        return (await runtime.infer({"text": array}))["vector"]

    alone = await embed(b"hello world")
    batch = await embed(b"hello world", b"good morning all hello world and more", b"")
    assert batch.shape == (3, 4)
    # Padding to the longest text of the batch is masked out of the pooling...
    np.testing.assert_allclose(batch[0], alone[0], atol=1e-6)
    # ...and texts longer than max_length are truncated (4 tokens: good morning all hello).
    np.testing.assert_allclose(batch[1], (await embed(b"good morning all hello"))[0], atol=1e-6)
    with pytest.raises(InvalidInputError, match="UTF-8") as caught:
        await embed(b"\xff\xfe")
    assert caught.value.field == "text"
    await runtime.on_unload()


async def test_malformed_steps_are_refused_at_load(
    store: LocalArtifactStore, tmp_path: Path
) -> None:
    package = await store.fetch("words", "1")
    for step, phrase in [
        ({"kind": "detokenize"}, "unknown step kind 'detokenize'"),
        ({"kind": "tokenizer", "file": "tokenizer.json", "input": "nope"}, "not a signature"),
        ({"kind": "tokenizer", "file": "tokenizer.json"}, "malformed"),
    ]:
        manifest = package.manifest.model_copy(update={"preprocess": step})
        runtime = create_runtime(manifest, SETTINGS)
        with pytest.raises(ArtifactError, match=phrase):
            await runtime.load(package.model_copy(update={"manifest": manifest}))


async def test_load_time_is_observed(store: LocalArtifactStore) -> None:
    labels = {"model": "tiny", "version": "onnx"}
    before = REGISTRY.get_sample_value("tidegate_model_load_seconds_count", labels) or 0.0
    runtime = await load_package(store, "tiny", "onnx", SETTINGS)
    await runtime.on_unload()
    assert REGISTRY.get_sample_value("tidegate_model_load_seconds_count", labels) == before + 1


def test_device_choice() -> None:
    auto, cpu, cuda = (ModelSettings(device=d) for d in ("auto", "cpu", "cuda"))
    with_cuda = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert onnx_providers(auto, with_cuda) == with_cuda
    assert onnx_providers(auto, ["CPUExecutionProvider"]) == ["CPUExecutionProvider"]
    assert onnx_providers(cpu, with_cuda) == ["CPUExecutionProvider"]
    assert torch_device(auto, True) == "cuda"
    assert torch_device(auto, False) == "cpu"
    assert torch_device(cpu, True) == "cpu"
    assert torch_device(cuda, True) == "cuda"
    with pytest.raises(ConfigurationError, match="no CUDA device"):
        torch_device(cuda, False)
    with pytest.raises(ConfigurationError, match="onnxruntime sees no CUDA"):
        onnx_providers(cuda, ["CPUExecutionProvider"])


async def test_an_archive_that_unpickles_is_refused_unless_allowed(
    store: LocalArtifactStore,
) -> None:
    with pytest.raises(ArtifactError, match="unpickles"):
        await load_package(store, "tiny", "pt2", ModelSettings())
