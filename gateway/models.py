"""Which model versions exist and which one serves, and their V2 metadata.

Manifests come from the artifact store (`agents.store.LocalArtifactStore`, or anything with its
`manifest`/`versions`/`models` methods). The serving version of each model comes from
`ModelSettings.serving_config` (`[models.NAME] version = "V"`), re-read when the file changes.
"""

from __future__ import annotations

import asyncio
import tomllib
from pathlib import Path
from typing import Any, Protocol

from cachetools import TTLCache

from agents.manifest import Manifest
from tidegate.errors import ConfigurationError, ModelNotFoundError

__all__ = ["PLATFORMS", "ManifestSource", "ModelCatalog", "ServingConfig"]

PLATFORMS = {"onnx": "onnxruntime_onnx", "torch": "pytorch_torchscript"}
# Versions are immutable, but a version can be removed: cached manifests expire soon enough.
_CACHE_TTL_S = 10.0


class ManifestSource(Protocol):
    async def manifest(self, name: str, version: str) -> Manifest: ...

    async def versions(self, name: str) -> list[str]: ...


class ServingConfig:
    """`serving.toml`, re-read whenever its modification time changes."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._stamp: float | None = None
        self._versions: dict[str, str] = {}

    def _load(self) -> dict[str, str]:
        try:
            stamp = self._path.stat().st_mtime
        except FileNotFoundError:
            raise ConfigurationError(f"serving config {self._path} does not exist") from None
        if stamp != self._stamp:
            try:
                parsed = tomllib.loads(self._path.read_text())
            except tomllib.TOMLDecodeError as exc:
                raise ConfigurationError(f"serving config {self._path}: {exc}") from exc
            models = parsed.get("models", {})
            self._versions = {
                name: str(entry["version"])
                for name, entry in models.items()
                if isinstance(entry, dict) and "version" in entry
            }
            self._stamp = stamp
        return self._versions

    async def version(self, name: str) -> str | None:
        return (await asyncio.to_thread(self._load)).get(name)


class ModelCatalog:
    def __init__(self, source: ManifestSource, serving: ServingConfig) -> None:
        self._source = source
        self._serving = serving
        self._manifests: TTLCache[tuple[str, str], Manifest] = TTLCache(1024, _CACHE_TTL_S)

    async def serving_version(self, name: str) -> str:
        version = await self._serving.version(name)
        if version is None:
            raise ModelNotFoundError(f"model {name!r} has no serving version")
        return version

    async def manifest(self, name: str, version: str | None = None) -> Manifest:
        """The manifest of a version, or of the serving version; `ModelNotFoundError` if none."""
        resolved = version if version is not None else await self.serving_version(name)
        cached = self._manifests.get((name, resolved))
        if cached is not None:
            return cached
        found = await self._source.manifest(name, resolved)
        self._manifests[(name, resolved)] = found
        return found

    async def metadata(self, name: str, version: str | None = None) -> dict[str, Any]:
        """V2 model metadata; `versions` lists every version that may be asked for by name."""
        manifest = await self.manifest(name, version)
        return {
            "name": name,
            "versions": await self._source.versions(name),
            "platform": PLATFORMS.get(manifest.runtime, manifest.runtime),
            "inputs": [spec.model_dump(mode="json") for spec in manifest.signature.inputs],
            "outputs": [spec.model_dump(mode="json") for spec in manifest.signature.outputs],
        }
