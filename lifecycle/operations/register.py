"""Registering a model version: read a package directory, import it into the artifact store,
and validate it by loading and warming it up exactly as a worker would.

A package directory holds `manifest.json` (an `tidegate.models.manifest.Manifest`) and the files it
lists. Validation is the worker's own `load_package` (fetch, sha256 check, load, warm-up on a
synthetic batch), so a version that validates here is one a worker can load. An artifact that cannot
be imported (a file whose sha256 differs from its manifest) or cannot be loaded is still registered,
with the reason it failed, and never becomes servable: the attempt stays in the audit log.

Through the gateway (`root`), a package is read only under the packages root, links resolved
(`confined`): a `deploy` key may not make the gateway read any path on its host.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from tidegate.core.errors import ArtifactError, ArtifactIntegrityError, ModelNotFoundError
from tidegate.lifecycle.domain import events as ev
from tidegate.models.manifest import Manifest
from tidegate.models.model_settings import ModelSettings
from tidegate.models.runtime import load_package
from tidegate.models.store import LocalArtifactStore

__all__ = [
    "MANIFEST_FILE",
    "Imported",
    "check_confined",
    "confined",
    "import_package",
    "read_package",
    "validate",
]

MANIFEST_FILE = "manifest.json"
_OUTSIDE = "no package {path} under the packages root (TIDEGATE_MODELS_PACKAGES_ROOT) to read"


def confined(root: Path, given: Path) -> Path:
    """`given` (absolute, or relative to `root`) as a directory under `root` once every link is
    resolved; else one `ArtifactError` whatever the reason (outside, missing, not a directory),
    so a refusal never tells which paths exist."""
    base = root.resolve()
    found = (given if given.is_absolute() else base / given).resolve()
    if not (found.is_relative_to(base) and found.is_dir()):
        raise ArtifactError(_OUTSIDE.format(path=given))
    return found


def check_confined(root: Path, directory: Path, manifest: Manifest) -> None:
    """Refuse a package whose files (through links) resolve outside `root`."""
    base = root.resolve()
    for relative in manifest.files:
        if not (directory / relative).resolve().is_relative_to(base):
            raise ArtifactError(_OUTSIDE.format(path=directory))


def read_package(directory: Path, name: str | None = None, version: str | None = None) -> Manifest:
    """The package's manifest, with `name`/`version` replacing the manifest's own if given."""
    path = directory / MANIFEST_FILE
    if not directory.is_dir():
        raise ArtifactError(f"{directory} is not a directory holding a {MANIFEST_FILE}")
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ArtifactError(f"{directory} has no {MANIFEST_FILE}") from None
    except ValueError as exc:
        raise ArtifactError(f"{path} is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ArtifactError(f"{path} must hold a JSON object")
    raw.pop("created_at", None)
    if name:
        raw["name"] = name
    if version:
        raw["version"] = version
    try:
        return Manifest.model_validate(raw)
    except ValidationError as exc:
        raise ArtifactError(f"{path} is not a valid manifest: {exc}") from None


@dataclass(frozen=True, slots=True)
class Imported:
    """What `ModelRegistered` records: the stored manifest, or the declared one and why the
    store refused it."""

    manifest: Manifest
    artifact_uri: str
    failure: str | None = None

    def registered(self) -> ev.ModelRegistered:
        m = self.manifest
        return ev.ModelRegistered(
            version=m.version,
            runtime=m.runtime,
            artifact_uri=self.artifact_uri,
            sha256=dict(m.files),
            signature_json=m.signature.model_dump_json(),
            description=m.description,
        )


async def import_package(
    store: LocalArtifactStore, directory: Path, manifest: Manifest
) -> Imported:
    """Put the files into the content-addressed store (sha256 computed, or checked if the
    manifest gives them). Putting identical content again is a no-op.

    A corrupt or incomplete package comes back with its `failure`, to be registered as failed.
    Other content under a version the store already holds is refused outright: that is a
    naming mistake, not an artifact to keep on record.
    """
    try:
        stored = await store.put(directory, manifest)
    except ArtifactIntegrityError as exc:
        return Imported(manifest, directory.absolute().as_uri(), f"{type(exc).__name__}: {exc}")
    except ArtifactError as exc:
        if await _stored(store, manifest):
            raise
        return Imported(manifest, directory.absolute().as_uri(), f"{type(exc).__name__}: {exc}")
    uri = (store.root / "manifests" / stored.name / f"{stored.version}.json").as_uri()
    return Imported(stored, uri)


async def _stored(store: LocalArtifactStore, manifest: Manifest) -> bool:
    try:
        await store.manifest(manifest.name, manifest.version)
    except ModelNotFoundError:
        return False
    return True


async def validate(
    store: LocalArtifactStore, name: str, version: str, settings: ModelSettings
) -> ev.ArtifactValidated | ev.ValidationFailed:
    """Load and warm up the stored version, then unload it. Any failure, of the store or of the
    runtime (a malformed ONNX graph raises the runtime's own errors), fails the validation."""
    started = time.perf_counter()
    try:
        runtime = await load_package(store, name, version, settings)
    except Exception as exc:
        return ev.ValidationFailed(version, f"{type(exc).__name__}: {exc}"[:2000])
    load_ms = (time.perf_counter() - started) * 1000.0
    device = runtime.device
    await runtime.on_unload()
    return ev.ArtifactValidated(version, load_ms=round(load_ms, 3), device=device)
