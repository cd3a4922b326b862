"""`LocalArtifactStore`: the artifact store on the local file system."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from tidegate.core.errors import ArtifactError, ArtifactIntegrityError, ModelNotFoundError
from tidegate.models.manifest import Manifest, ModelPackage
from tidegate.models.model_settings import ModelSettings
from tidegate.models.store.artifact_store import ArtifactStore
from tidegate.models.store.files import (
    check_layout,
    content,
    create_exclusive,
    label,
    materialise,
    natural_key,
    sha256_file,
    verify,
)

__all__ = ["LocalArtifactStore"]

_CHUNK = 1 << 20
# The patterns of Manifest.name and Manifest.version: names that come from requests are checked
# against them before they become paths, so they can never leave the store.
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class LocalArtifactStore(ArtifactStore):
    """The store on the local file system, under `settings.store_dir`."""

    def __init__(self, settings: ModelSettings | None = None) -> None:
        self.root = (settings or ModelSettings()).store_dir.absolute()

    async def put(self, source_dir: Path, manifest: Manifest) -> Manifest:
        return await asyncio.to_thread(self._put, source_dir, manifest)

    async def fetch(self, name: str, version: str) -> ModelPackage:
        return await asyncio.to_thread(self._fetch, name, version)

    async def manifest(self, name: str, version: str) -> Manifest:
        return await asyncio.to_thread(self._read_manifest, name, version)

    async def versions(self, name: str) -> list[str]:
        """Versions of a model, numbers in numeric order (`[]` for an unknown model)."""
        return await asyncio.to_thread(self._versions, name)

    async def models(self) -> list[str]:
        """Names of the models with at least one version."""
        return await asyncio.to_thread(self._models)

    async def remove(self, name: str, version: str) -> None:
        """Delete a version's manifest and fetched files. Blobs stay: others may share them."""
        await asyncio.to_thread(self._remove, name, version)

    def package_dir(self, name: str, version: str) -> Path:
        return self.root / "packages" / name / version

    def blob_path(self, digest: str) -> Path:
        return self.root / "blobs" / "sha256" / digest

    def _manifest_path(self, name: str, version: str) -> Path:
        if not (_NAME.match(name) and _VERSION.match(version)):
            raise ModelNotFoundError(f"no model {name!r} version {version!r}")
        return self.root / "manifests" / name / f"{version}.json"

    # -- put --------------------------------------------------------------------------------

    def _put(self, source_dir: Path, manifest: Manifest) -> Manifest:
        check_layout(manifest)
        files: dict[str, str] = {}
        for relative, given in sorted(manifest.files.items()):
            source = source_dir / relative
            if not source.is_file():
                raise ArtifactError(f"{label(manifest)}: {relative} is not a file in {source_dir}")
            digest = self._store_blob(source)
            if given and given != digest:
                raise ArtifactIntegrityError(
                    f"{label(manifest)}: {relative} has sha256 {digest}, the manifest says {given}"
                )
            files[relative] = digest
        stored = Manifest.model_validate(
            {
                **manifest.model_dump(),
                "files": files,
                "created_at": manifest.created_at or datetime.now(UTC),
            }
        )
        return self._write_manifest(stored)

    def _store_blob(self, source: Path) -> str:
        blobs = self.root / "blobs" / "sha256"
        blobs.mkdir(parents=True, exist_ok=True)
        # Hash while copying: what is stored is exactly what was hashed, even if the source
        # changes meanwhile.
        fd, tmp_name = tempfile.mkstemp(dir=blobs, prefix=".incoming-")
        tmp = Path(tmp_name)
        try:
            digest = hashlib.sha256()
            with source.open("rb") as reader, os.fdopen(fd, "wb") as writer:
                while chunk := reader.read(_CHUNK):
                    digest.update(chunk)
                    writer.write(chunk)
            hexdigest = digest.hexdigest()
            target = blobs / hexdigest
            if target.is_file() and sha256_file(target) == hexdigest:
                return hexdigest
            tmp.chmod(0o444)
            os.replace(tmp, target)
            return hexdigest
        finally:
            tmp.unlink(missing_ok=True)

    def _write_manifest(self, manifest: Manifest) -> Manifest:
        path = self._manifest_path(manifest.name, manifest.version)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=".incoming-")
        with os.fdopen(fd, "w") as handle:
            handle.write(manifest.model_dump_json(indent=2))
        try:
            create_exclusive(Path(tmp_name), path)
        except FileExistsError:
            existing = self._read_manifest(manifest.name, manifest.version)
            if content(existing) != content(manifest):
                raise ArtifactError(
                    f"{label(manifest)} already exists with different content; versions are "
                    "immutable, publish a new version instead"
                ) from None
            return existing
        finally:
            Path(tmp_name).unlink(missing_ok=True)
        return manifest

    # -- fetch ------------------------------------------------------------------------------

    def _read_manifest(self, name: str, version: str) -> Manifest:
        path = self._manifest_path(name, version)
        try:
            raw = path.read_text()
        except FileNotFoundError:
            raise ModelNotFoundError(f"no model {name!r} version {version!r}") from None
        try:
            manifest = Manifest.model_validate(json.loads(raw))
        except (ValueError, ValidationError) as exc:
            raise ArtifactError(f"manifest {path} is malformed: {exc}") from exc
        if (manifest.name, manifest.version) != (name, version):
            raise ArtifactError(f"manifest {path} describes {label(manifest)}")
        return manifest

    def _fetch(self, name: str, version: str) -> ModelPackage:
        manifest = self._read_manifest(name, version)
        check_layout(manifest)
        directory = self.package_dir(name, version)
        for relative, expected in sorted(manifest.files.items()):
            blob = self.blob_path(expected)
            if not blob.is_file():
                raise ArtifactIntegrityError(
                    f"{label(manifest)}: the blob of {relative} ({expected}) is missing"
                )
            verify(manifest, relative, blob, expected)
            target = directory / relative
            if not target.exists():
                materialise(manifest, relative, blob, target)
            elif not os.path.samefile(target, blob):
                verify(manifest, relative, target, expected)
        return ModelPackage(manifest=manifest, directory=directory)

    # -- listing ----------------------------------------------------------------------------

    def _versions(self, name: str) -> list[str]:
        if not _NAME.match(name):
            return []
        folder = self.root / "manifests" / name
        if not folder.is_dir():
            return []
        found = [p.stem for p in folder.glob("*.json") if not p.name.startswith(".")]
        return sorted(found, key=natural_key)

    def _models(self) -> list[str]:
        folder = self.root / "manifests"
        if not folder.is_dir():
            return []
        return sorted(p.name for p in folder.iterdir() if p.is_dir() and self._versions(p.name))

    def _remove(self, name: str, version: str) -> None:
        path = self._manifest_path(name, version)
        if not path.exists():
            raise ModelNotFoundError(f"no model {name!r} version {version!r}")
        path.unlink()
        shutil.rmtree(self.package_dir(name, version), ignore_errors=True)
