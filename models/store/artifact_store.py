"""The artifact store interface."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

from tidegate.models.manifest import Manifest, ModelPackage

__all__ = ["ArtifactStore"]


class ArtifactStore(ABC):
    """Where model versions live. Versions are immutable once put."""

    @abstractmethod
    async def put(self, source_dir: Path, manifest: Manifest) -> Manifest:
        """Store the manifest's files from `source_dir`; return the manifest with their hashes.

        Hashes left empty in `manifest.files` are computed; given ones must match. Putting the
        same content again is a no-op; different content under an existing version is refused.
        """

    @abstractmethod
    async def fetch(self, name: str, version: str) -> ModelPackage:
        """Verify every file of a version and return them in a directory."""

    async def manifest(self, name: str, version: str) -> Manifest:
        """The manifest of a version (`ModelNotFoundError` if there is none)."""
        return (await self.fetch(name, version)).manifest
