"""A CUDA failure at inference time moves a version to the CPU; any other failure does not.

No GPU is needed: the runtimes are loaded on the CPU, told they are on CUDA, and their `_compute`
raises what CUDA would while `device == "cuda"`. What runs after the move is the real CPU model.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch
from prometheus_client import REGISTRY

from tests.unit.models.tiny_store import build_tiny_store
from tidegate.core.errors import ModelExecutionError
from tidegate.models.model_settings import ModelSettings
from tidegate.models.runtime import load_package
from tidegate.models.runtime.device import cuda_failure
from tidegate.models.runtime.executor import ExecutorRuntime
from tidegate.models.runtime.onnx import OnnxRuntime
from tidegate.models.runtime.torch import TorchRuntime
from tidegate.models.store import LocalArtifactStore

# Imports torch (tests/unit/conftest.py keeps the fast tier from collecting it).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

SETTINGS = ModelSettings()
NEVER_INLINE = SETTINGS.model_copy(update={"inline_below_ms": 0.0})
BATCH = np.random.default_rng(3).standard_normal((6, 8)).astype(np.float32)
LOGGER = "tidegate.models.runtime.executor"
# What each backend says when a kernel faults, as it words it.
ONNX_FAULT = (
    "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code returned while running "
    "Gemm node. Name:'/0/Gemm' Status Message: CUDA failure 700: an illegal memory access was "
    "encountered ; GPU=0 ; hostname=w1 ; file=cuda_call.cc ; line=129 ; expr=cudaMemcpyAsync"
)
TORCH_FAULT = (
    "CUDA error: an illegal memory access was encountered\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the "
    "stacktrace below might be incorrect.\n"
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1"
)
RUNTIMES: dict[str, type[ExecutorRuntime]] = {"onnx": OnnxRuntime, "torch": TorchRuntime}
FAULTS = {"onnx": ONNX_FAULT, "torch": TORCH_FAULT}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> LocalArtifactStore:
    return build_tiny_store(tmp_path_factory.mktemp("fallback"))


@dataclass
class FakeCuda:
    """Makes a runtime class fail on "CUDA" and records what its runtimes did."""

    error: Exception
    computed: list[str] = field(default_factory=list)
    loads: list[tuple[str, str]] = field(default_factory=list)
    load_error: Exception | None = None


@pytest.fixture(params=list(RUNTIMES))
def version(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch, version: str) -> FakeCuda:
    cls = RUNTIMES[version]
    fake = FakeCuda(RuntimeError(FAULTS[version]))
    compute, load_model = cls._compute, cls._load_model

    def failing_compute(self: ExecutorRuntime, feeds: dict[str, Any]) -> dict[str, Any]:
        fake.computed.append(self.device)
        if self.device == "cuda":
            raise fake.error
        return compute(self, feeds)

    def recorded_load(self: ExecutorRuntime, package: Any) -> None:
        fake.loads.append((threading.current_thread().name, self.settings.device))
        if fake.load_error is not None:
            raise fake.load_error
        load_model(self, package)

    monkeypatch.setattr(cls, "_compute", failing_compute)
    monkeypatch.setattr(cls, "_load_model", recorded_load)
    return fake


def fallbacks(version: str) -> float:
    labels = {"model": "tiny", "version": version, "from": "cuda", "to": "cpu"}
    return REGISTRY.get_sample_value("tidegate_model_device_fallbacks_total", labels) or 0.0


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelname == "WARNING"]


async def on_fake_cuda(
    store: LocalArtifactStore, version: str, fake: FakeCuda, settings: ModelSettings = SETTINGS
) -> tuple[ExecutorRuntime, np.ndarray[Any, Any]]:
    """A version loaded on the CPU, its answer to BATCH there, then marked as being on CUDA."""
    runtime = await load_package(store, "tiny", version, settings)
    assert isinstance(runtime, ExecutorRuntime)
    expected = (await runtime.infer({"x": BATCH}))["p"]
    runtime.device = "cuda"
    fake.computed.clear()
    fake.loads.clear()
    return runtime, expected


async def test_a_cuda_failure_moves_the_version_to_the_cpu_and_answers_the_batch(
    store: LocalArtifactStore, version: str, fake_cuda: FakeCuda, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    runtime, expected = await on_fake_cuda(store, version, fake_cuda)
    before = fallbacks(version)

    answered = (await runtime.infer({"x": BATCH}))["p"]

    np.testing.assert_allclose(answered, expected, atol=1e-6)
    assert runtime.device == "cpu"
    assert runtime.settings.device == "cpu"
    assert fake_cuda.computed == ["cuda", "cpu"], "the failed batch was not retried on the CPU"
    # Reloaded once, on the CPU, in the version's own thread (not on the event loop).
    assert len(fake_cuda.loads) == 1
    thread, device = fake_cuda.loads[0]
    assert thread.startswith(f"model-tiny version {version}")
    assert device == "cpu"
    assert fallbacks(version) == before + 1
    # One line: the error itself, without torch's advice below it.
    assert warnings_of(caplog) == [
        f"tiny version {version} moved from CUDA to the CPU after a CUDA failure: "
        f"{FAULTS[version].splitlines()[0]}"
    ]

    # From then on it serves on the CPU: no failure, no second move, no second line.
    again = (await runtime.infer({"x": BATCH[:2]}))["p"]
    np.testing.assert_allclose(again, expected[:2], atol=1e-6)
    assert fake_cuda.computed[-1] == "cpu"
    assert len(fake_cuda.loads) == 1
    assert fallbacks(version) == before + 1
    assert len(warnings_of(caplog)) == 1
    await runtime.on_unload()


async def test_batches_failing_side_by_side_move_the_version_once(
    store: LocalArtifactStore, version: str, fake_cuda: FakeCuda, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    # In the thread, so all three are queued on CUDA before the first failure is seen.
    runtime, expected = await on_fake_cuda(store, version, fake_cuda, NEVER_INLINE)
    before = fallbacks(version)

    answers = await asyncio.gather(*(runtime.infer({"x": BATCH}) for _ in range(3)))

    for answer in answers:
        np.testing.assert_allclose(answer["p"], expected, atol=1e-6)
    assert fake_cuda.computed.count("cuda") == 3
    assert len(fake_cuda.loads) == 1
    assert fallbacks(version) == before + 1
    assert len(warnings_of(caplog)) == 1
    await runtime.on_unload()


async def test_an_error_that_is_not_cudas_stays_a_model_error(
    store: LocalArtifactStore, version: str, fake_cuda: FakeCuda, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    message = "Expected all tensors to be on the same device, but found cuda:0 and cpu!"
    fake_cuda.error = RuntimeError(message)
    runtime, _ = await on_fake_cuda(store, version, fake_cuda)
    before = fallbacks(version)

    with pytest.raises(ModelExecutionError) as caught:
        await runtime.infer({"x": BATCH})

    assert str(caught.value) == message
    assert runtime.device == "cuda"
    assert fake_cuda.computed == ["cuda"]
    assert fake_cuda.loads == []
    assert fallbacks(version) == before
    assert warnings_of(caplog) == []
    await runtime.on_unload()


async def test_with_the_fallback_off_a_cuda_failure_fails_the_batch(
    store: LocalArtifactStore, version: str, fake_cuda: FakeCuda
) -> None:
    settings = SETTINGS.model_copy(update={"cuda_fallback": False})
    runtime, _ = await on_fake_cuda(store, version, fake_cuda, settings)
    before = fallbacks(version)

    with pytest.raises(ModelExecutionError, match="illegal memory access"):
        await runtime.infer({"x": BATCH})

    assert runtime.device == "cuda"
    assert fake_cuda.loads == []
    assert fallbacks(version) == before
    await runtime.on_unload()


async def test_a_failed_reload_keeps_the_version_where_it_was_and_a_later_failure_retries(
    store: LocalArtifactStore, version: str, fake_cuda: FakeCuda, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    runtime, expected = await on_fake_cuda(store, version, fake_cuda)
    before = fallbacks(version)
    fake_cuda.load_error = OSError("no space left on device")

    with pytest.raises(ModelExecutionError) as caught:
        await runtime.infer({"x": BATCH})

    assert "failed on CUDA (" in str(caught.value)
    assert "could not be loaded on the CPU: no space left on device" in str(caught.value)
    assert runtime.device == "cuda"
    assert fallbacks(version) == before
    assert warnings_of(caplog) == []

    fake_cuda.load_error = None
    np.testing.assert_allclose((await runtime.infer({"x": BATCH}))["p"], expected, atol=1e-6)
    assert runtime.device == "cpu"
    assert fallbacks(version) == before + 1
    await runtime.on_unload()


class _WrapperError(Exception):
    """Stands in for a runtime's wrapper around the backend's error."""


def _wrapped(cause: BaseException) -> BaseException:
    try:
        raise _WrapperError("the model failed") from cause
    except _WrapperError as exc:
        return exc


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (RuntimeError(ONNX_FAULT), ONNX_FAULT),
        (RuntimeError("CUBLAS failure 13: CUBLAS_STATUS_EXECUTION_FAILED ; GPU=0"), None),
        (RuntimeError("CUDNN failure 4: CUDNN_STATUS_INTERNAL_ERROR ; GPU=0"), None),
        (RuntimeError("CUDA error cudaErrorLaunchFailure:unspecified launch failure"), None),
        (RuntimeError(TORCH_FAULT), "CUDA error: an illegal memory access was encountered"),
        (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), None),
        (RuntimeError("cuDNN error: CUDNN_STATUS_EXECUTION_FAILED"), None),
        (RuntimeError("CUDA error: device-side assert triggered"), None),
        # TorchScript puts its own traceback before the error.
        (
            RuntimeError(
                "The following operation failed in the TorchScript interpreter.\n"
                "Traceback of TorchScript (most recent call last):\n"
                "RuntimeError: CUDA error: an illegal memory access was encountered"
            ),
            "RuntimeError: CUDA error: an illegal memory access was encountered",
        ),
        # torch's own type, whatever the message says.
        (torch.OutOfMemoryError("Tried to allocate 2.00 GiB"), "Tried to allocate 2.00 GiB"),
        # Wrapped: the cause decides.
        (
            _wrapped(RuntimeError("CUDA failure 719: unspecified launch failure")),
            "CUDA failure 719: unspecified launch failure",
        ),
    ],
)
def test_cuda_failures_are_recognised(error: BaseException, line: str | None) -> None:
    assert cuda_failure(error) == (line or str(error).splitlines()[0])


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("negative input in 16 cells"),
        RuntimeError("Expected all tensors to be on the same device, but found cuda:0 and cpu!"),
        ValueError("input 'cuda_usage' is missing"),
        RuntimeError(
            "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Unexpected input data type. "
            "Actual: (tensor(double)) , expected: (tensor(float))"
        ),
        ModelExecutionError("output 'p' has 1 rows for a batch of 5"),
        _wrapped(ValueError("bad shape")),
    ],
)
def test_other_errors_are_not_cuda_failures(error: BaseException) -> None:
    assert cuda_failure(error) is None
