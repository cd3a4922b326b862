"""Which device a runtime loads onto (CUDA when present and allowed, the CPU otherwise), and which
inference errors mean that CUDA itself failed."""

from __future__ import annotations

import re

from tidegate.core.errors import ConfigurationError
from tidegate.models.model_settings import ModelSettings

__all__ = [
    "CPU_PROVIDER",
    "CUDA_PROVIDER",
    "cuda_failure",
    "onnx_providers",
    "torch_device",
    "use_cuda",
]

CUDA_PROVIDER = "CUDAExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"

# What the CUDA libraries' own error reports start with, as onnxruntime ("CUDA failure 700: ...",
# "CUBLAS failure 13: ...", "CUDA error cudaErrorIllegalAddress: ...") and torch ("CUDA error: ...",
# "CUDA out of memory", "cuDNN error: CUDNN_STATUS_...") word them. A model's own message that
# only names a device ("found cuda:0 and cpu") is a model bug, not a failing device, and the CPU
# would not cure it.
_CUDA_MESSAGE = re.compile(
    r"\b(?:cuda|cudnn|cublas(?:lt)?|cufft|curand|cusparse|nccl|nvrtc)"
    r"(?: error| failure| out of memory|_status_\w+)"
    r"|\bcudaError\w+|device-side assert",
    re.IGNORECASE,
)
# torch's exception types for a failing accelerator, matched by name so that classifying an
# onnxruntime error never imports torch.
_TORCH_DEVICE_ERRORS = frozenset({"AcceleratorError", "OutOfMemoryError"})


def use_cuda(settings: ModelSettings, available: bool, backend: str) -> bool:
    """`auto` takes CUDA when the backend sees it; an explicit `cuda` without it is an error
    rather than a silent slow fallback."""
    if settings.device == "cpu":
        return False
    if available:
        return True
    if settings.device == "cuda":
        raise ConfigurationError(f"TIDEGATE_MODELS_DEVICE=cuda but {backend} sees no CUDA device")
    return False


def onnx_providers(settings: ModelSettings, available: list[str]) -> list[str]:
    """Execution providers in order of preference, from onnxruntime's available ones."""
    if use_cuda(settings, CUDA_PROVIDER in available, "onnxruntime"):
        return [CUDA_PROVIDER, CPU_PROVIDER]
    return [CPU_PROVIDER]


def torch_device(settings: ModelSettings, cuda_available: bool) -> str:
    return "cuda" if use_cuda(settings, cuda_available, "torch") else "cpu"


def cuda_failure(error: BaseException) -> str | None:
    """The line of `error` that says CUDA itself failed (a kernel fault, an exhausted or lost
    device, a CUDA library's failure), so that the CPU may still serve the batch; None for any
    other error. The chain of causes is followed: TorchScript and the runtimes wrap the original,
    and torch puts its own traceback lines before it."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        lines = [line.strip() for line in str(current).splitlines() if line.strip()]
        for line in lines:
            if _CUDA_MESSAGE.search(line):
                return line
        kind = type(current)
        if kind.__module__.startswith("torch") and kind.__name__ in _TORCH_DEVICE_ERRORS:
            return lines[0] if lines else kind.__name__
        current = current.__cause__ or current.__context__
    return None
