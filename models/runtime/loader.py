"""Make a runtime for a manifest, and load a stored version ready to serve."""

from __future__ import annotations

import time

from tidegate.models.manifest import Manifest
from tidegate.models.model_settings import ModelSettings
from tidegate.models.runtime.contract import ModelRuntime
from tidegate.models.runtime.runtime_metrics import MODEL_LOAD_SECONDS
from tidegate.models.store import ArtifactStore

__all__ = ["MODEL_LOAD_SECONDS", "create_runtime", "load_package"]


def create_runtime(manifest: Manifest, settings: ModelSettings) -> ModelRuntime:
    """An unloaded runtime of the manifest's kind. Backends are imported only when needed: a
    process that serves ONNX models never imports torch."""
    if manifest.runtime == "torch":
        from tidegate.models.runtime.torch import TorchRuntime

        return TorchRuntime(settings)
    from tidegate.models.runtime.onnx import OnnxRuntime

    return OnnxRuntime(settings)


async def load_package(
    store: ArtifactStore, name: str, version: str, settings: ModelSettings
) -> ModelRuntime:
    """Fetch and verify a version, load it and warm it up. A corrupted artifact fails the fetch
    (`ArtifactIntegrityError`) and is never handed to a runtime."""
    started = time.perf_counter()
    package = await store.fetch(name, version)
    runtime = create_runtime(package.manifest, settings)
    await runtime.load(package)
    try:
        await runtime.on_warmup()
    except BaseException:
        await runtime.on_unload()
        raise
    MODEL_LOAD_SECONDS.labels(model=name, version=version).observe(time.perf_counter() - started)
    return runtime
