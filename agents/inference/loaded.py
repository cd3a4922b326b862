"""Loaded model versions, cached per (model, version), loaded once and warmed up before serving.

The cache is the mechanism: a version is loaded once however many callers ask at the same time, a
failed load is remembered for a while (so a broken artifact does not stall every request that names
it, and it is never counted as loaded), and the order of use is kept for LRU eviction. Which
versions to load and when to drop them is policy, in
`tidegate.agents.inference.version_manager.VersionManager`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from tidegate.agents.inference.compare import Kind, task_of
from tidegate.core.errors import ModelNotFoundError, ModelUnavailableError, TidegateError
from tidegate.core.telemetry import get_logger
from tidegate.models.model_settings import ModelSettings
from tidegate.models.runtime import load_package
from tidegate.models.runtime.contract import ModelRuntime
from tidegate.models.store import LocalArtifactStore
from tidegate.schemas.signature import Signature

__all__ = [
    "LoadedModel",
    "ModelCache",
    "ModelLoader",
    "VersionKey",
    "Versions",
    "resident_bytes",
    "store_loader",
    "unload",
]

log = get_logger(__name__)

VersionKey = tuple[str, str]
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True, slots=True)
class LoadedModel:
    name: str
    version: str
    signature: Signature
    runtime: ModelRuntime
    task: Kind = "other"
    """What the outputs mean, for shadow comparisons (the manifest's `task`, or a guess)."""
    load_ms: float = 0.0
    """Fetch, checksum, load and warm-up time, measured by the cache."""
    rss_bytes: int | None = None
    """How much the process's resident memory grew during the load, measured by the cache; None
    when another load overlapped it (their growth cannot be told apart) or RSS is unreadable."""

    @property
    def batchable(self) -> bool:
        """Requests can be stacked along dim 0 only when every input has a free first dim."""
        return all(spec.shape and spec.shape[0] == -1 for spec in self.signature.inputs)


ModelLoader = Callable[[str, str], Awaitable[LoadedModel]]


class Versions(Protocol):
    """Loaded versions: what the router asks (`ready`) and what serves (`get`)."""

    def ready(self, model: str, version: str) -> bool: ...

    async def get(self, model: str, version: str) -> LoadedModel: ...


def store_loader(settings: ModelSettings) -> ModelLoader:
    """Load versions from the local artifact store with `tidegate.models.runtime.load_package`
    (which
    fetches, verifies every file's sha256, loads and warms up)."""

    store = LocalArtifactStore(settings)

    async def load(name: str, version: str) -> LoadedModel:
        manifest = await store.manifest(name, version)
        runtime = await load_package(store, name, version, settings)
        return LoadedModel(name, version, manifest.signature, runtime, task_of(manifest))

    return load


class ModelCache:
    def __init__(self, loader: ModelLoader, *, retry_after_s: float = 30.0) -> None:
        self._loader = loader
        self._retry_after = retry_after_s
        # Least recently used first: `get` moves a version to the end.
        self._models: OrderedDict[VersionKey, LoadedModel] = OrderedDict()
        self._failures: dict[VersionKey, tuple[float, TidegateError]] = {}
        self._locks: dict[VersionKey, asyncio.Lock] = {}
        # Loads running now, and whether each overlapped another (its RSS growth is then shared).
        self._loading: dict[VersionKey, bool] = {}
        self._used_at: dict[VersionKey, float] = {}  # time.monotonic() of each version's last get
        # Runtime classes loaded before: the first load of each also pays the runtime's own
        # start (onnxruntime's about 30 MiB), so its RSS growth is no measure of the version.
        self._kinds: set[type[object]] = set()

    def __len__(self) -> int:
        return len(self._models)

    def loaded(self) -> list[VersionKey]:
        return sorted(self._models)

    def by_recency(self) -> list[VersionKey]:
        """Loaded versions, the least recently used first."""
        return list(self._models)

    def used_at(self, key: VersionKey) -> float:
        """When a request last took the version (`time.monotonic()`); 0 for never."""
        return self._used_at.get(key, 0.0)

    def peek(self, name: str, version: str) -> LoadedModel | None:
        """The version if it is loaded and warm; never loads, never counts as a use."""
        return self._models.get((name, version))

    def failure(self, name: str, version: str) -> TidegateError | None:
        """Why the last load of the version failed, while that is remembered (a later `get`
        raises it again without loading)."""
        failed = self._failures.get((name, version))
        if failed is None or asyncio.get_running_loop().time() - failed[0] >= self._retry_after:
            return None
        return failed[1]

    async def get(self, name: str, version: str) -> LoadedModel:
        key = (name, version)
        self._used_at[key] = time.monotonic()
        model = self._models.get(key)
        if model is not None:
            self._models.move_to_end(key)
            return model
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            model = self._models.get(key)
            if model is not None:
                self._models.move_to_end(key)
                return model
            now = asyncio.get_running_loop().time()
            failed = self._failures.get(key)
            if failed is not None and now - failed[0] < self._retry_after:
                raise failed[1]
            started = time.perf_counter()
            rss_before = resident_bytes()
            for other in self._loading:
                self._loading[other] = True
            self._loading[key] = bool(self._loading)
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
            finally:
                overlapped = self._loading.pop(key)
            load_ms = (time.perf_counter() - started) * 1000.0
            rss_after = resident_bytes()
            grown = None
            first = type(model.runtime) not in self._kinds
            self._kinds.add(type(model.runtime))
            if not (overlapped or first) and rss_before is not None and rss_after is not None:
                grown = max(0, rss_after - rss_before)
            model = dataclasses.replace(model, load_ms=load_ms, rss_bytes=grown)
            self._failures.pop(key, None)
            self._models[key] = model
            log.info(
                "loaded %s version %s on %s in %.0f ms",
                name,
                version,
                model.runtime.device,
                load_ms,
            )
            return model

    def pop(self, name: str, version: str) -> LoadedModel | None:
        """Take the version out of the cache (the caller unloads it): new requests load it again,
        calls already handed to its runtime finish first."""
        self._used_at.pop((name, version), None)
        return self._models.pop((name, version), None)

    async def close(self) -> None:
        models, self._models = self._models, OrderedDict()
        for model in models.values():
            await unload(model)


def resident_bytes() -> int | None:
    """This process's resident set size, from /proc (Linux); None where it cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            resident_pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return resident_pages * _PAGE_BYTES


async def unload(model: LoadedModel) -> None:
    """Release a version's runtime; a failure is logged, never raised (it is going anyway)."""
    try:
        await model.runtime.on_unload()
    except Exception:
        log.exception("unloading %s version %s failed", model.name, model.version)
