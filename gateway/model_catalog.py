"""Which model versions are served and ready, and their V2 metadata.

What is served comes from the model lifecycle (a `tidegate.lifecycle.readmodels.feed.LifecycleFeed`,
kept current from the `model-lifecycle` topic): a model is served while it has a primary version; a
version may be asked for by name while it is validated and not retired; a version is ready once some
worker reported it loaded and warmed up. Manifests (signatures, runtime) come from the artifact
store (`tidegate.models.store.LocalArtifactStore`, or anything with its `manifest` method).

The gateway never routes: a request without a version is checked against the primary's
signature, and the worker that takes it decides the version (`tidegate.lifecycle.domain.routing`).
"""

from __future__ import annotations

from typing import Any, Protocol

from cachetools import TTLCache

from tidegate.core.errors import ModelNotFoundError, ModelUnavailableError
from tidegate.lifecycle.domain.state import ModelState
from tidegate.models.manifest import Manifest
from tidegate.models.store.files import natural_key

__all__ = ["PLATFORMS", "LifecycleView", "ManifestSource", "ModelCatalog"]

PLATFORMS = {"onnx": "onnxruntime_onnx", "torch": "pytorch_torchscript"}
# Versions are immutable, but a version can be removed: cached manifests expire soon enough.
_CACHE_TTL_S = 10.0


class ManifestSource(Protocol):
    async def manifest(self, name: str, version: str) -> Manifest: ...


class LifecycleView(Protocol):
    """The part of `LifecycleFeed` the catalog reads."""

    def state(self, model: str) -> ModelState | None: ...

    async def caught_up(self, timeout_s: float) -> None: ...


class ModelCatalog:
    def __init__(
        self, source: ManifestSource, lifecycle: LifecycleView, *, catch_up_s: float = 10.0
    ) -> None:
        self._source = source
        self._lifecycle = lifecycle
        self._catch_up_s = catch_up_s
        self._manifests: TTLCache[tuple[str, str], Manifest] = TTLCache(1024, _CACHE_TTL_S)

    async def _state(self, name: str) -> ModelState:
        # Until the feed has replayed the topic, "unknown model" could be a lie: wait for it
        # (at once after the first time), or answer 503 (`LifecycleUnavailableError`).
        await self._lifecycle.caught_up(self._catch_up_s)
        state = self._lifecycle.state(name)
        if state is None or not any(v.servable for v in state.versions):
            raise ModelNotFoundError(f"model {name!r} is not served")
        return state

    async def serving_version(self, name: str) -> str:
        """The primary version: the one whose signature a request without a version must fit."""
        state = await self._state(name)
        if state.primary is None:
            raise ModelNotFoundError(f"model {name!r} has no primary version")
        return state.primary

    async def _resolve(self, name: str, version: str | None) -> tuple[ModelState, str]:
        state = await self._state(name)
        if version is None:
            if state.primary is None:
                raise ModelNotFoundError(f"model {name!r} has no primary version")
            return state, state.primary
        found = state.version(version)
        if found is None or not found.servable:
            why = "is unknown" if found is None else f"is {found.status.value}"
            raise ModelNotFoundError(f"model {name!r} version {version!r} {why}")
        return state, version

    async def manifest(self, name: str, version: str | None = None) -> Manifest:
        """The manifest of a servable version, or of the primary; `ModelNotFoundError` if none."""
        _, resolved = await self._resolve(name, version)
        cached = self._manifests.get((name, resolved))
        if cached is not None:
            return cached
        found = await self._source.manifest(name, resolved)
        self._manifests[(name, resolved)] = found
        return found

    async def check_ready(self, name: str, version: str | None = None) -> None:
        """Return when a worker has the version (or the primary) loaded and warm; otherwise
        `ModelUnavailableError` (or `ModelNotFoundError` when it is not served at all)."""
        state, resolved = await self._resolve(name, version)
        found = state.version(resolved)
        if found is None or not found.ready:
            raise ModelUnavailableError(
                f"model {name!r} version {resolved!r} is not loaded by any worker yet"
            )

    async def metadata(self, name: str, version: str | None = None) -> dict[str, Any]:
        """V2 model metadata; `versions` lists every version that may be asked for by name."""
        state, _ = await self._resolve(name, version)
        manifest = await self.manifest(name, version)
        servable = sorted((v.version for v in state.versions if v.servable), key=natural_key)
        return {
            "name": name,
            "versions": servable,
            "platform": PLATFORMS.get(manifest.runtime, manifest.runtime),
            "inputs": [spec.model_dump(mode="json") for spec in manifest.signature.inputs],
            "outputs": [spec.model_dump(mode="json") for spec in manifest.signature.outputs],
        }
