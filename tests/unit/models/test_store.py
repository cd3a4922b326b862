"""The local artifact store: content addressing, immutability and integrity on every fetch."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from tidegate.core.errors import ArtifactError, ArtifactIntegrityError, ModelNotFoundError
from tidegate.models.manifest import Manifest
from tidegate.models.model_settings import ModelSettings
from tidegate.models.runtime import loader
from tidegate.models.store import LocalArtifactStore
from tidegate.schemas.signature import Signature, TensorSpec

SIGNATURE = Signature(
    inputs=(TensorSpec(name="x", datatype="FP32", shape=(-1, 2)),),
    outputs=(TensorSpec(name="y", datatype="FP32", shape=(-1, 1)),),
)
FILES = {"model.onnx": b"graph bytes", "assets/vocab.txt": b"a\nb\n"}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _manifest(version: str = "1", **changes: Any) -> Manifest:
    fields: dict[str, object] = {
        "name": "demo",
        "version": version,
        "runtime": "onnx",
        "entrypoint": "model.onnx",
        "files": dict.fromkeys(FILES, ""),
        "signature": SIGNATURE,
    }
    return Manifest.model_validate({**fields, **changes})


@pytest.fixture
def store(tmp_path: Path) -> LocalArtifactStore:
    return LocalArtifactStore(ModelSettings(store_dir=tmp_path / "store"))


@pytest.fixture
def source(tmp_path: Path) -> Path:
    folder = tmp_path / "source"
    for relative, data in FILES.items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_bytes(data)
    return folder


def _corrupt(path: Path) -> None:
    path.chmod(0o644)
    path.write_bytes(b"tampered")


async def test_put_then_fetch_round_trip(store: LocalArtifactStore, source: Path) -> None:
    stored = await store.put(source, _manifest())
    assert stored.files == {name: _sha(data) for name, data in FILES.items()}
    assert stored.created_at is not None
    on_disk = store.root / "manifests" / "demo" / "1.json"
    assert Manifest.model_validate_json(on_disk.read_text()) == stored
    for digest in stored.files.values():
        blob = store.blob_path(digest)
        assert blob.read_bytes() in FILES.values()
        assert not os.access(blob, os.W_OK) or os.geteuid() == 0
        assert blob.stat().st_mode & 0o222 == 0
    package = await store.fetch("demo", "1")
    assert package.manifest == stored
    assert package.directory == store.root / "packages" / "demo" / "1"
    for relative, data in FILES.items():
        assert package.path(relative).read_bytes() == data
    # Fetched files are the blobs themselves, not copies.
    assert os.path.samefile(package.path("model.onnx"), store.blob_path(stored.files["model.onnx"]))
    assert await store.manifest("demo", "1") == stored


async def test_put_is_idempotent_and_versions_are_immutable(
    store: LocalArtifactStore, source: Path
) -> None:
    first = await store.put(source, _manifest())
    assert await store.put(source, _manifest()) == first
    (source / "model.onnx").write_bytes(b"other graph")
    with pytest.raises(ArtifactError, match="already exists with different content"):
        await store.put(source, _manifest())
    with pytest.raises(ArtifactError, match="already exists with different content"):
        await store.put(source, _manifest(description="changed"))
    package = await store.fetch("demo", "1")
    assert package.path("model.onnx").read_bytes() == FILES["model.onnx"]
    # The same blob serves two versions.
    second = await store.put(source, _manifest("2"))
    assert second.files["assets/vocab.txt"] == first.files["assets/vocab.txt"]


async def test_a_given_hash_must_match(store: LocalArtifactStore, source: Path) -> None:
    wrong = _manifest(files={"model.onnx": "0" * 64, "assets/vocab.txt": ""})
    with pytest.raises(ArtifactIntegrityError, match=r"model\.onnx has sha256"):
        await store.put(source, wrong)
    with pytest.raises(ModelNotFoundError):
        await store.fetch("demo", "1")


async def test_checksum_is_verified_on_every_fetch(store: LocalArtifactStore, source: Path) -> None:
    stored = await store.put(source, _manifest())
    await store.fetch("demo", "1")
    digest = stored.files["model.onnx"]
    _corrupt(store.blob_path(digest))
    with pytest.raises(ArtifactIntegrityError) as caught:
        await store.fetch("demo", "1")
    message = str(caught.value)
    assert "model.onnx" in message
    assert f"expected sha256 {digest}" in message
    assert f"got {_sha(b'tampered')}" in message


async def test_a_corrupted_copy_is_refused(
    store: LocalArtifactStore, source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_links(src: object, dst: object) -> None:
        raise OSError("links not allowed here")

    # A file system without hard links: the store copies, and still verifies every copy.
    monkeypatch.setattr(os, "link", no_links)
    stored = await store.put(source, _manifest())
    package = await store.fetch("demo", "1")
    copy = package.path("assets/vocab.txt")
    assert copy.read_bytes() == FILES["assets/vocab.txt"]
    assert not os.path.samefile(copy, store.blob_path(stored.files["assets/vocab.txt"]))
    _corrupt(copy)
    with pytest.raises(ArtifactIntegrityError, match=r"assets/vocab.txt is corrupted"):
        await store.fetch("demo", "1")


async def test_a_missing_blob_is_refused(store: LocalArtifactStore, source: Path) -> None:
    stored = await store.put(source, _manifest())
    store.blob_path(stored.files["model.onnx"]).unlink()
    with pytest.raises(ArtifactIntegrityError, match=r"model\.onnx .* is missing"):
        await store.fetch("demo", "1")


async def test_a_corrupted_artifact_is_never_loaded(
    store: LocalArtifactStore, source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    created: list[Manifest] = []
    monkeypatch.setattr(loader, "create_runtime", lambda m, s: created.append(m))
    stored = await store.put(source, _manifest())
    _corrupt(store.blob_path(stored.files["model.onnx"]))
    with pytest.raises(ArtifactIntegrityError):
        await loader.load_package(store, "demo", "1", ModelSettings(store_dir=store.root))
    assert created == []


async def test_unknown_versions_and_unsafe_names_are_not_found(
    store: LocalArtifactStore, source: Path
) -> None:
    await store.put(source, _manifest())
    for name, version in [
        ("demo", "2"),
        ("nope", "1"),
        ("..", "1"),
        ("demo", "../1"),
        ("a/b", "1"),
    ]:
        with pytest.raises(ModelNotFoundError):
            await store.fetch(name, version)


@pytest.mark.parametrize(
    ("changes", "phrase"),
    [
        ({"files": {"../escape": "", "model.onnx": ""}}, "must be relative"),
        ({"files": {"/etc/passwd": "", "model.onnx": ""}}, "must be relative"),
        ({"entrypoint": "missing.onnx"}, "missing.onnx is not among"),
        (
            {"preprocess": {"kind": "tokenizer", "file": "tok.json", "input": "x"}},
            "tok.json is not among",
        ),
        ({"files": {"model.onnx": "", "absent.bin": ""}}, "absent.bin is not a file"),
    ],
)
async def test_malformed_manifests_are_refused(
    store: LocalArtifactStore, source: Path, changes: dict[str, Any], phrase: str
) -> None:
    with pytest.raises(ArtifactError, match=phrase):
        await store.put(source, _manifest(**changes))


async def test_listing_and_removal(store: LocalArtifactStore, source: Path) -> None:
    assert await store.models() == []
    for version in ["10", "2", "1-torch", "1"]:
        await store.put(source, _manifest(version))
    await store.put(source, _manifest().model_copy(update={"name": "other"}))
    assert await store.models() == ["demo", "other"]
    assert await store.versions("demo") == ["1", "1-torch", "2", "10"]
    assert await store.versions("missing") == []
    await store.fetch("demo", "2")
    await store.remove("demo", "2")
    assert await store.versions("demo") == ["1", "1-torch", "10"]
    assert not store.package_dir("demo", "2").exists()
    with pytest.raises(ModelNotFoundError):
        await store.remove("demo", "2")
    # Blobs stay for the versions that share them.
    package = await store.fetch("demo", "10")
    assert package.path("model.onnx").read_bytes() == FILES["model.onnx"]


async def test_a_manifest_under_the_wrong_name_is_refused(
    store: LocalArtifactStore, source: Path
) -> None:
    await store.put(source, _manifest())
    (store.root / "manifests" / "demo" / "1.json").rename(
        store.root / "manifests" / "demo" / "3.json"
    )
    with pytest.raises(ArtifactError, match="describes demo version 1"):
        await store.fetch("demo", "3")
