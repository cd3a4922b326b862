"""The `gpu` install extra agrees with the CPU pins and with the commands docs/gpu.md gives."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[3]


def _pins(requirements: list[str]) -> dict[str, Requirement]:
    return {req.name: req for req in map(Requirement, requirements)}


PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
BASE = _pins(PROJECT["dependencies"])
GPU = _pins(PROJECT["optional-dependencies"]["gpu"])


def _version(requirement: Requirement) -> str:
    (spec,) = requirement.specifier
    assert spec.operator == "==", f"{requirement} is not pinned"
    return spec.version


def test_the_gpu_extra_pins_onnxruntime_gpu_with_its_cuda_wheels_and_the_base_torch() -> None:
    assert set(GPU) == {"onnxruntime-gpu", "torch"}
    gpu = GPU["onnxruntime-gpu"]
    assert gpu.extras == {"cuda", "cudnn"}, "without them nothing installs CUDA 13 for onnxruntime"
    # The same major version: the runtime's use of onnxruntime is tested on the CPU wheel.
    assert _version(gpu).split(".")[0] == _version(BASE["onnxruntime"]).split(".")[0]
    # A different torch pin would make `pip install .[gpu]` unresolvable.
    assert _version(GPU["torch"]) == _version(BASE["torch"])


def test_the_docs_reinstall_the_pinned_onnxruntime_gpu() -> None:
    docs = (REPO / "docs" / "gpu.md").read_text()
    assert f"onnxruntime-gpu=={_version(GPU['onnxruntime-gpu'])}" in docs
    assert "pip uninstall -y onnxruntime onnxruntime-gpu" in docs
