"""Build the example models into the artifact store, skipping versions already built.

Each built version can also be written out as an importable package directory,
`<packages_dir>/<name>/<version>/` (manifest.json plus its files), which is what
`tidegate models register` takes.

A version is skipped when its stored `build.json` (the builder's recipe) is byte-identical to the
current recipe: same recipe, same artifact, no retraining. A version stored from another recipe
is left alone unless `force` is set, which rebuilds and replaces it (versions are otherwise
immutable).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tidegate.core.errors import ArtifactError, ConfigurationError, ModelNotFoundError
from tidegate.examples.builder import ModelBuilder
from tidegate.examples.fraud_builders import FRAUD_BUILDERS
from tidegate.examples.minilm import MinilmV1
from tidegate.models.manifest import Manifest
from tidegate.models.store import LocalArtifactStore, sha256_file

__all__ = [
    "BUILDERS",
    "BUILD_FILE",
    "MANIFEST_FILE",
    "BuildOutcome",
    "build_models",
    "export_package",
]

BUILDERS: tuple[type[ModelBuilder], ...] = (*FRAUD_BUILDERS, MinilmV1)
BUILD_FILE = "build.json"
MANIFEST_FILE = "manifest.json"
Action = Literal["built", "skipped", "unchanged", "replaced"]


@dataclass(frozen=True)
class BuildOutcome:
    manifest: Manifest
    action: Action
    seconds: float


async def build_models(
    store: LocalArtifactStore,
    only: Collection[str] = (),
    force: bool = False,
    progress: Callable[[str], None] | None = None,
    packages_dir: Path | None = None,
) -> list[BuildOutcome]:
    """Build every example model (or those named in `only`) into `store`, and export each
    version as a package directory under `packages_dir` if given."""
    known = {builder.name for builder in BUILDERS}
    unknown = sorted(set(only) - known)
    if unknown:
        raise ConfigurationError(f"no example model {unknown[0]!r}; known: {sorted(known)}")
    outcomes = []
    for builder_class in BUILDERS:
        if not only or builder_class.name in only:
            outcome = await _build_one(store, builder_class(), force, progress)
            if packages_dir is not None:
                await asyncio.to_thread(export_package, store, outcome.manifest, packages_dir)
            outcomes.append(outcome)
    return outcomes


def export_package(store: LocalArtifactStore, manifest: Manifest, packages_dir: Path) -> Path:
    """Write `packages_dir/<name>/<version>/`: the stored manifest and its files, hard-linked to
    the store's blobs (copied where links are impossible). An up-to-date package is left as it
    is; a stale one is replaced whole, through a rename, so a reader never sees half of one."""
    target = packages_dir / manifest.name / manifest.version
    text = manifest.model_dump_json(indent=2) + "\n"
    current = target / MANIFEST_FILE
    fresh = current.is_file() and current.read_text() == text
    if fresh and all((target / rel).is_file() for rel in manifest.files):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{manifest.version}-"))
    try:
        staging.chmod(0o755)  # mkdtemp's 0o700 would hide the package from other users
        for relative, digest in manifest.files.items():
            destination = staging / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(store.blob_path(digest), destination)
            except OSError:
                shutil.copyfile(store.blob_path(digest), destination)
        (staging / MANIFEST_FILE).write_text(text)
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


async def _build_one(
    store: LocalArtifactStore,
    builder: ModelBuilder,
    force: bool,
    progress: Callable[[str], None] | None,
) -> BuildOutcome:
    started = time.perf_counter()
    label = f"{builder.name} {builder.version}"
    recipe = await asyncio.to_thread(_recipe_bytes, builder)
    recipe_digest = hashlib.sha256(recipe).hexdigest()
    existing = await _stored(store, builder)
    if existing is not None and not force:
        if existing.files.get(BUILD_FILE) == recipe_digest:
            return BuildOutcome(existing, "skipped", time.perf_counter() - started)
        raise ArtifactError(
            f"{label} is in the store from another recipe; publish a new version, or rebuild "
            "with --force to replace it"
        )
    if progress:
        progress(f"building {label}")
    store.root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=store.root, prefix=".build-") as tmp:
        workdir = Path(tmp)
        built = await asyncio.to_thread(builder.build, workdir)
        (workdir / BUILD_FILE).write_bytes(recipe)
        fresh = await asyncio.to_thread(_hashed, built, workdir)
        action: Action = "built"
        if existing is not None:
            if _same(existing, fresh):
                action = "unchanged"
            else:
                await store.remove(builder.name, builder.version)
                action = "replaced"
        try:
            stored = await store.put(workdir, fresh)
        except ArtifactError:
            # Another build of the same recipe may have stored it meanwhile: TorchScript archives
            # differ byte for byte between builds (a random serialization id), the weights not.
            raced = await _stored(store, builder)
            if existing is None and raced and raced.files.get(BUILD_FILE) == recipe_digest:
                return BuildOutcome(raced, "skipped", time.perf_counter() - started)
            raise
    return BuildOutcome(stored, action, time.perf_counter() - started)


async def _stored(store: LocalArtifactStore, builder: ModelBuilder) -> Manifest | None:
    try:
        return await store.manifest(builder.name, builder.version)
    except ModelNotFoundError:
        return None


def _recipe_bytes(builder: ModelBuilder) -> bytes:
    body = {"name": builder.name, "version": builder.version, "recipe": builder.recipe()}
    return (json.dumps(body, indent=2, sort_keys=True) + "\n").encode()


def _hashed(manifest: Manifest, workdir: Path) -> Manifest:
    names = [*manifest.files, BUILD_FILE]
    files = {name: sha256_file(workdir / name) for name in sorted(names)}
    return manifest.model_copy(update={"files": files})


def _same(left: Manifest, right: Manifest) -> bool:
    exclude = {"created_at"}
    return left.model_dump(mode="json", exclude=exclude) == right.model_dump(
        mode="json", exclude=exclude
    )
