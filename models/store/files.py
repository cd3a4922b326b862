"""File operations of the local store: hashing, verifying, publishing without torn reads."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath

from tidegate.core.errors import ArtifactError, ArtifactIntegrityError
from tidegate.models.manifest import Manifest
from tidegate.schemas.version_order import natural_key

__all__ = [
    "check_layout",
    "content",
    "create_exclusive",
    "label",
    "materialise",
    "natural_key",
    "sha256_file",
    "verify",
]

_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def label(manifest: Manifest) -> str:
    return f"{manifest.name} version {manifest.version}"


def content(manifest: Manifest) -> dict[str, object]:
    return manifest.model_dump(mode="json", exclude={"created_at"})


def check_layout(manifest: Manifest) -> None:
    """Relative paths only (nothing may land outside the package) and the named files listed."""
    for relative in manifest.files:
        path = PurePosixPath(relative)
        if not relative or path.is_absolute() or ".." in path.parts or "\\" in relative:
            raise ArtifactError(f"{label(manifest)}: file path {relative!r} must be relative")
    named = [manifest.entrypoint]
    for step in (manifest.preprocess, manifest.postprocess):
        if step and isinstance(step.get("file"), str):
            named.append(step["file"])
    for relative in named:
        if relative not in manifest.files:
            raise ArtifactError(f"{label(manifest)}: {relative} is not among the manifest's files")


def create_exclusive(tmp: Path, path: Path) -> None:
    """Publish `tmp` as `path` unless `path` exists (`FileExistsError`)."""
    try:
        # link() refuses an existing target atomically: of two concurrent puts, one wins.
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError:
        # No hard links on this file system: check, then rename (atomic, if not exclusive).
        if path.exists():
            raise FileExistsError(path) from None
        os.replace(tmp, path)


def verify(manifest: Manifest, relative: str, path: Path, expected: str) -> None:
    actual = sha256_file(path)
    if actual != expected:
        raise ArtifactIntegrityError(
            f"{label(manifest)}: {relative} is corrupted ({path}): expected sha256 {expected}, "
            f"got {actual}; it will not be served"
        )


def materialise(manifest: Manifest, relative: str, blob: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        tmp.unlink()
        try:
            os.link(blob, tmp)
        except OSError:
            # Another file system, or links not allowed: a verified copy does the same job.
            shutil.copyfile(blob, tmp)
            verify(manifest, relative, tmp, blob.name)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
