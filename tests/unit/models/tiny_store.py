"""A store holding one tiny model as ONNX and as TorchScript, for the device tests (the unit tests
of the CPU fallback and the GPU tests in tests/integration/models)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import torch
from torch import nn

from tidegate.examples.export import export_onnx, export_torchscript
from tidegate.models.manifest import Manifest
from tidegate.models.model_settings import ModelSettings
from tidegate.models.store import LocalArtifactStore
from tidegate.schemas.signature import Signature, TensorSpec

__all__ = ["TINY_SIGNATURE", "build_tiny_store", "put_module"]

TINY_SIGNATURE = Signature(
    inputs=(TensorSpec(name="x", datatype="FP32", shape=(-1, 8)),),
    outputs=(TensorSpec(name="p", datatype="FP32", shape=(-1, 3)),),
)


def put_module(
    store: LocalArtifactStore, root: Path, name: str, version: str, module: nn.Module, runtime: str
) -> None:
    """Export a module of TINY_SIGNATURE (`onnx` or `torch`, TorchScript) and store it."""
    workdir = root / f"{name}-{version}"
    workdir.mkdir()
    if runtime == "onnx":
        entrypoint = "model.onnx"
        axes = {"x": {0: "batch"}, "p": {0: "batch"}}
        export_onnx(module, (torch.zeros(2, 8),), workdir / entrypoint, ["x"], ["p"], axes)
    else:
        entrypoint = "model.pt"
        export_torchscript(module, workdir / entrypoint)
    manifest = Manifest.model_validate(
        {
            "name": name,
            "version": version,
            "runtime": runtime,
            "entrypoint": entrypoint,
            "signature": TINY_SIGNATURE,
            "files": {path.name: "" for path in workdir.iterdir()},
        }
    )
    asyncio.run(store.put(workdir, manifest))


def build_tiny_store(root: Path) -> LocalArtifactStore:
    """`tiny` versions `onnx` and `torch`: the same softmax MLP, x (n, 8) -> p (n, 3)."""
    store = LocalArtifactStore(ModelSettings(store_dir=root / "store"))
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3), nn.Softmax(dim=1))
    for runtime in ("onnx", "torch"):
        put_module(store, root, "tiny", runtime, module, runtime)
    return store
