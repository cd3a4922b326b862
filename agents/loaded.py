"""Loaded model versions, cached per (model, version), loaded once and warmed up before serving.

Every serving version is loaded when the worker starts; a version first asked for by a request is
loaded then, once, however many requests ask at the same time. A failed load is remembered for a
while so a broken artifact does not stall every request that names it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from agents.runtime.base import ModelRuntime
from agents.signature import Signature
from tidegate.errors import ModelNotFoundError, ModelUnavailableError, TidegateError
from tidegate.settings import ModelSettings
from tidegate.telemetry import get_logger

__all__ = ["LoadedModel", "ModelCache", "ModelLoader", "store_loader"]

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class LoadedModel:
    name: str
    version: str
    signature: Signature
    runtime: ModelRuntime

    @property
    def batchable(self) -> bool:
        """Requests can be stacked along dim 0 only when every input has a free first dim."""
        return all(spec.shape and spec.shape[0] == -1 for spec in self.signature.inputs)


ModelLoader = Callable[[str, str], Awaitable[LoadedModel]]


def store_loader(settings: ModelSettings) -> ModelLoader:
    """Load versions from the local artifact store with `agents.runtime.load_package`."""
    from agents.runtime import load_package
    from agents.store import LocalArtifactStore

    store = LocalArtifactStore(settings)

    async def load(name: str, version: str) -> LoadedModel:
        manifest = await store.manifest(name, version)
        runtime = await load_package(store, name, version, settings)
        return LoadedModel(name, version, manifest.signature, runtime)

    return load


class ModelCache:
    def __init__(self, loader: ModelLoader, *, retry_after_s: float = 30.0) -> None:
        self._loader = loader
        self._retry_after = retry_after_s
        self._models: dict[tuple[str, str], LoadedModel] = {}
        self._failures: dict[tuple[str, str], tuple[float, TidegateError]] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    def loaded(self) -> list[tuple[str, str]]:
        return sorted(self._models)

    async def get(self, name: str, version: str) -> LoadedModel:
        key = (name, version)
        model = self._models.get(key)
        if model is not None:
            return model
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            model = self._models.get(key)
            if model is not None:
                return model
            now = asyncio.get_running_loop().time()
            failed = self._failures.get(key)
            if failed is not None and now - failed[0] < self._retry_after:
                raise failed[1]
            try:
                model = await self._loader(name, version)
            except ModelNotFoundError as exc:
                self._failures[key] = (now, exc)
                raise
            except Exception as exc:
                error = ModelUnavailableError(f"{name} version {version} cannot be loaded: {exc}")
                self._failures[key] = (now, error)
                log.exception("loading %s version %s failed", name, version)
                raise error from exc
            self._failures.pop(key, None)
            self._models[key] = model
            log.info("loaded %s version %s on %s", name, version, model.runtime.device)
            return model

    async def preload(self, versions: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
        """Load (and warm up) each version; returns why each one that failed did."""
        failures: dict[tuple[str, str], str] = {}
        for name, version in versions:
            try:
                await self.get(name, version)
            except TidegateError as exc:
                failures[(name, version)] = str(exc)
        return failures

    async def close(self) -> None:
        models, self._models = self._models, {}
        for model in models.values():
            try:
                await model.runtime.on_unload()
            except Exception:
                log.exception("unloading %s version %s failed", model.name, model.version)
