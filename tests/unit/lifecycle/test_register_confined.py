"""Registration through the gateway reads only under the packages root: a path outside it, a
link out of it, or a package file that links out, all get the one same refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidegate.core.errors import ArtifactError
from tidegate.lifecycle.operations.register import check_confined, confined
from tidegate.models.manifest import Manifest
from tidegate.schemas.signature import Signature, TensorSpec


def manifest(*files: str) -> Manifest:
    spec = TensorSpec(name="x", datatype="FP32", shape=(-1, 1))
    return Manifest(
        name="m",
        version="1",
        runtime="onnx",
        entrypoint=files[0],
        files=dict.fromkeys(files, "0" * 64),
        signature=Signature(inputs=(spec,), outputs=(spec,)),
    )


def test_only_directories_under_the_root_are_read(tmp_path: Path) -> None:
    root, outside = tmp_path / "packages", tmp_path / "elsewhere"
    (root / "m" / "1").mkdir(parents=True)
    outside.mkdir()
    (root / "escape").symlink_to(outside, target_is_directory=True)
    assert confined(root, Path("m/1")) == (root / "m" / "1").resolve()
    assert confined(root, root / "m" / "1") == (root / "m" / "1").resolve()
    refusals = [outside, Path("../elsewhere"), Path("escape"), Path("m/404"), Path("/etc")]
    messages = set()
    for given in refusals:
        with pytest.raises(ArtifactError) as refused:
            confined(root, given)
        messages.add(str(refused.value).replace(str(given), "<path>"))
    assert len(messages) == 1, "one answer, whatever the reason: it tells no path exists"


def test_a_package_file_linking_out_of_the_root_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "packages"
    package = root / "m" / "1"
    package.mkdir(parents=True)
    (package / "model.onnx").write_bytes(b"onnx")
    secret = tmp_path / "secret.key"
    secret.write_text("not for you")
    (package / "weights.bin").symlink_to(secret)
    check_confined(root, package, manifest("model.onnx"))
    with pytest.raises(ArtifactError, match="under the packages root"):
        check_confined(root, package, manifest("model.onnx", "weights.bin"))
