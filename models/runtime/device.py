"""Which device a runtime loads onto: CUDA when present and allowed, the CPU otherwise."""

from __future__ import annotations

from tidegate.core.errors import ConfigurationError
from tidegate.models.model_settings import ModelSettings

__all__ = ["CPU_PROVIDER", "CUDA_PROVIDER", "onnx_providers", "torch_device", "use_cuda"]

CUDA_PROVIDER = "CUDAExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"


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
