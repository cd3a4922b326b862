"""The `gpu` install extra agrees with the CPU extras and with the commands docs/gpu.md gives."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[3]


def _pins(requirements: list[str]) -> dict[str, Requirement]:
    return {req.name: req for req in map(Requirement, requirements)}


PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
EXTRAS = PROJECT["optional-dependencies"]
WORKER = _pins(EXTRAS["worker"])
TORCH = _pins(EXTRAS["torch"])
GPU = _pins(EXTRAS["gpu"])


def _lowest(requirement: Requirement) -> Version:
    (low,) = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
    return low


def test_the_gpu_extra_takes_onnxruntime_gpu_with_its_cuda_wheels_and_the_same_torch() -> None:
    # nvidia-ml-py: the workers' GPU metrics (NVML), pure Python over the driver's library.
    assert set(GPU) == {"onnxruntime-gpu", "torch", "nvidia-ml-py"}
    gpu = GPU["onnxruntime-gpu"]
    assert gpu.extras == {"cuda", "cudnn"}, "without them nothing installs CUDA 13 for onnxruntime"
    # The same major version: the runtime's use of onnxruntime is tested on the CPU wheel.
    assert _lowest(gpu).major == _lowest(WORKER["onnxruntime"]).major
    # A different torch range would make `pip install .[all,gpu]` resolve two ways.
    assert GPU["torch"].specifier == TORCH["torch"].specifier


def test_the_docs_reinstall_an_onnxruntime_gpu_the_extra_accepts() -> None:
    docs = (REPO / "docs" / "gpu.md").read_text()
    (pinned,) = re.findall(r"onnxruntime-gpu==([0-9.]+)", docs)
    assert GPU["onnxruntime-gpu"].specifier.contains(pinned)
    assert "pip uninstall -y onnxruntime onnxruntime-gpu" in docs
