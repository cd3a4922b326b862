"""The runtimes on a real GPU. Each test says why it is skipped where there is none: torch without
a CUDA device, or onnxruntime without the CUDA provider (the CPU-only wheel; docs/gpu.md).

With TIDEGATE_REQUIRE_GPU=1 nothing is skipped: a run on a GPU machine whose CUDA or GPU wheel is
missing fails instead of passing by skipping everything (docs/gpu.md, "Testing on a GPU").
No server of the local stack is needed.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
import pytest
import torch
from prometheus_client import REGISTRY
from torch import nn

from tests.unit.models.tiny_store import build_tiny_store, put_module
from tidegate.agents.gpu_metrics import nvml_collector
from tidegate.models.model_settings import ModelSettings
from tidegate.models.runtime import load_package
from tidegate.models.runtime.device import CUDA_PROVIDER
from tidegate.models.runtime.onnx import OnnxRuntime, installed_onnxruntime_wheels
from tidegate.models.store import LocalArtifactStore

pytestmark = pytest.mark.timeout(300)

REQUIRE_GPU = os.environ.get("TIDEGATE_REQUIRE_GPU") == "1"


def cuda_available() -> bool:
    return torch.cuda.is_available()


def onnx_cuda_available() -> bool:
    import onnxruntime as ort

    return cuda_available() and CUDA_PROVIDER in ort.get_available_providers()


def unless(available: bool, reason: str) -> pytest.MarkDecorator:
    """Skip where `available` is false, unless a GPU is required: then the test runs, and fails."""
    return pytest.mark.skipif(not available and not REQUIRE_GPU, reason=reason)


NO_CUDA = "no CUDA device here (torch.cuda.is_available() is false)"
NO_ONNX_CUDA = (
    "no CUDA device, or onnxruntime has no CUDAExecutionProvider (the CPU-only onnxruntime "
    "wheel is installed: pip install .[gpu], docs/gpu.md)"
)
CUDA = ModelSettings(device="cuda")
CPU = ModelSettings(device="cpu")
BATCH = np.random.default_rng(11).standard_normal((64, 8)).astype(np.float32)


class OutOfMemoryOnCuda(nn.Module):
    """Asks CUDA for 4 TiB: a real CUDA failure, and one that leaves the CUDA context usable
    (unlike a kernel fault, which would end every later CUDA test of the process)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            x = x + torch.zeros(1 << 40, device=x.device).sum()
        return x[:, :3].softmax(dim=1)


@pytest.mark.skipif(not REQUIRE_GPU, reason="TIDEGATE_REQUIRE_GPU=1 is not set")
def test_a_required_gpu_is_there_for_both_runtimes() -> None:
    assert cuda_available(), NO_CUDA
    assert onnx_cuda_available(), NO_ONNX_CUDA


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> LocalArtifactStore:
    root = tmp_path_factory.mktemp("gpu")
    store = build_tiny_store(root)
    put_module(store, root, "oom", "torch", OutOfMemoryOnCuda(), "torch")
    return store


async def _answers(store: LocalArtifactStore, version: str, settings: ModelSettings) -> Any:
    runtime = await load_package(store, "tiny", version, settings)
    try:
        return runtime.device, (await runtime.infer({"x": BATCH}))["p"]
    finally:
        await runtime.on_unload()


@unless(cuda_available(), NO_CUDA)
async def test_torch_serves_on_cuda_and_agrees_with_the_cpu(store: LocalArtifactStore) -> None:
    device, on_cuda = await _answers(store, "torch", CUDA)
    assert device == "cuda"
    _, on_cpu = await _answers(store, "torch", CPU)
    np.testing.assert_allclose(on_cuda, on_cpu, atol=1e-5)
    # auto takes CUDA when it is there.
    assert (await _answers(store, "torch", ModelSettings()))[0] == "cuda"


@unless(onnx_cuda_available(), NO_ONNX_CUDA)
async def test_onnx_serves_on_cuda_and_agrees_with_the_cpu(store: LocalArtifactStore) -> None:
    runtime = await load_package(store, "tiny", "onnx", CUDA)
    assert isinstance(runtime, OnnxRuntime)
    assert runtime.device == "cuda"
    assert runtime._session.get_providers()[0] == CUDA_PROVIDER
    on_cuda = (await runtime.infer({"x": BATCH}))["p"]
    await runtime.on_unload()
    _, on_cpu = await _answers(store, "onnx", CPU)
    np.testing.assert_allclose(on_cuda, on_cpu, atol=1e-5)


@unless(cuda_available(), NO_CUDA)
async def test_a_real_cuda_failure_moves_the_version_to_the_cpu(
    store: LocalArtifactStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tidegate.models.runtime.executor")
    labels = {"model": "oom", "version": "torch", "from": "cuda", "to": "cpu"}
    before = REGISTRY.get_sample_value("tidegate_model_device_fallbacks_total", labels) or 0.0
    # Warm-up is the first batch on CUDA: it moves the version before it serves.
    runtime = await load_package(store, "oom", "torch", CUDA)
    assert runtime.device == "cpu"
    answered = (await runtime.infer({"x": BATCH}))["p"]
    assert answered.shape == (64, 3)
    np.testing.assert_allclose(answered.sum(axis=1), 1.0, atol=1e-5)
    after = REGISTRY.get_sample_value("tidegate_model_device_fallbacks_total", labels)
    assert after == before + 1
    messages = [record.getMessage() for record in caplog.records]
    moved = [message for message in messages if "moved from CUDA to the CPU" in message]
    assert len(moved) == 1
    assert "oom version torch" in moved[0]
    assert "out of memory" in moved[0].lower()
    await runtime.on_unload()
    # The CUDA context survived: the next version still gets the GPU.
    assert (await _answers(store, "torch", CUDA))[0] == "cuda"


@unless(
    "onnxruntime-gpu" in installed_onnxruntime_wheels(),
    "onnxruntime-gpu is not installed (pip install .[gpu], docs/gpu.md)",
)
def test_onnxruntime_gpu_is_the_only_onnxruntime() -> None:
    assert installed_onnxruntime_wheels() == ["onnxruntime-gpu"], (
        "onnxruntime and onnxruntime-gpu share the onnxruntime module: uninstall both and "
        "install onnxruntime-gpu alone (docs/gpu.md)"
    )


@unless(cuda_available(), NO_CUDA)
def test_nvml_reports_each_cuda_device_on_the_workers_metrics() -> None:
    collector = nvml_collector()
    assert collector is not None, "CUDA is here, so NVML should be: is nvidia-ml-py installed?"
    try:
        samples = [s for family in collector.collect() for s in family.samples]
    finally:
        collector.close()
    busy = [s.value for s in samples if s.name == "tidegate_worker_gpu_utilisation_ratio"]
    assert len(busy) == torch.cuda.device_count()
    assert all(0.0 <= value <= 1.0 for value in busy)
    total = [s.value for s in samples if s.name == "tidegate_worker_gpu_memory_total_bytes"]
    assert all(value > 2**30 for value in total)
