"""Builders of the `fraud` and `fraud-lite` versions.

* `fraud` 1: the MLP as ONNX; `fraud` 1-torch: the same weights as TorchScript, so the torch
  runtime serves a real model and must agree with ONNX.
* `fraud` 2: retrained with another seed and fewer epochs; agrees with v1 on most, not all, rows.
* `fraud` 3: v1's weights as TorchScript that fails about a fifth of its inputs, on purpose.
* `fraud-lite` 1: logistic regression as ONNX, the fallback.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from tidegate.core.errors import ArtifactError
from tidegate.examples.builder import ModelBuilder
from tidegate.examples.export import ONNX_OPSET, export_onnx, export_torchscript, load_torchscript
from tidegate.examples.fraud import (
    DATA_SEED,
    FAULT_BELOW,
    FEATURES,
    TEST_ROWS,
    TRAIN_ROWS,
    FaultyFraud,
    TrainingRecipe,
    dataset,
    train,
)
from tidegate.models.manifest import Manifest, RuntimeKind
from tidegate.schemas.signature import Signature, TensorSpec

__all__ = ["FRAUD_BUILDERS", "FRAUD_SIGNATURE"]

FRAUD_SIGNATURE = Signature(
    inputs=(TensorSpec(name="features", datatype="FP32", shape=(-1, FEATURES)),),
    outputs=(TensorSpec(name="probabilities", datatype="FP32", shape=(-1, 2)),),
)
V1 = TrainingRecipe("mlp", seed=1, epochs=6, learning_rate=3e-3, batch_size=256)
V2 = TrainingRecipe("mlp", seed=2, epochs=4, learning_rate=3e-3, batch_size=256)
LITE = TrainingRecipe("linear", seed=3, epochs=5, learning_rate=1e-2, batch_size=128)
_BUILDER_REVISION = 1  # bump when a change here alters the artifacts of an unchanged recipe
_TOLERANCE = 1e-5


class _FraudBuilder(ModelBuilder):
    training: ClassVar[TrainingRecipe]
    runtime: ClassVar[RuntimeKind]
    faulty: ClassVar[bool] = False
    summary: ClassVar[str]

    def recipe(self) -> dict[str, Any]:
        return {
            "builder_revision": _BUILDER_REVISION,
            "data": {"seed": DATA_SEED, "train_rows": TRAIN_ROWS, "test_rows": TEST_ROWS},
            "training": asdict(self.training),
            "format": self.runtime,
            "onnx_opset": ONNX_OPSET if self.runtime == "onnx" else None,
            "fault_below": FAULT_BELOW if self.faulty else None,
        }

    def build(self, workdir: Path) -> Manifest:
        trained = train(self.training)
        module = FaultyFraud(trained.module) if self.faulty else trained.module  # type: ignore[arg-type]
        sample = _sample()
        with torch.inference_mode():
            expected = module(torch.from_numpy(sample)).numpy()
        if self.runtime == "onnx":
            entrypoint = "model.onnx"
            export_onnx(
                module,
                (torch.zeros(2, FEATURES),),
                workdir / entrypoint,
                inputs=["features"],
                outputs=["probabilities"],
                dynamic_axes={"features": {0: "batch"}, "probabilities": {0: "batch"}},
            )
            actual = _run_onnx(workdir / entrypoint, sample)
        else:
            entrypoint = "model.pt"
            export_torchscript(module, workdir / entrypoint)
            loaded = load_torchscript(workdir / entrypoint)
            with torch.inference_mode():
                actual = loaded(torch.from_numpy(sample)).numpy()
        gap = float(np.abs(actual - expected).max())
        if gap > _TOLERANCE:
            raise ArtifactError(f"fraud {self.version}: export differs from torch by {gap}")
        return Manifest(
            name=self.name,
            version=self.version,
            runtime=self.runtime,
            entrypoint=entrypoint,
            files={entrypoint: ""},
            signature=FRAUD_SIGNATURE,
            task="classifier",
            description=f"{self.summary} Test accuracy {trained.accuracy:.4f}.{self._extra()}",
        )

    def _extra(self) -> str:
        return ""


def _sample() -> np.ndarray[Any, np.dtype[np.float32]]:
    """Test rows v3 does not fail on, to compare an export with its torch module."""
    features, _ = dataset(TRAIN_ROWS + TEST_ROWS)
    test = features[TRAIN_ROWS:]
    return np.ascontiguousarray(test[test[:, 0] >= FAULT_BELOW][:512])


def _run_onnx(path: Path, sample: np.ndarray[Any, np.dtype[np.float32]]) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # one summation order: the same check result every build
    session = ort.InferenceSession(
        str(path), sess_options=options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, {"features": sample})[0]


class FraudV1(_FraudBuilder):
    name = "fraud"
    version = "1"
    training = V1
    runtime: ClassVar[RuntimeKind] = "onnx"
    summary = "MLP 64-256-256-2, softmax in the graph, seed 1, 6 epochs; ONNX."


class FraudV1Torch(FraudV1):
    version = "1-torch"
    runtime: ClassVar[RuntimeKind] = "torch"
    summary = "fraud v1's weights as TorchScript."


class FraudV2(_FraudBuilder):
    name = "fraud"
    version = "2"
    training = V2
    runtime: ClassVar[RuntimeKind] = "onnx"
    summary = "MLP 64-256-256-2 retrained: seed 2, 4 epochs; ONNX."

    def _extra(self) -> str:
        mine, v1 = train(self.training).predictions, train(V1).predictions
        agreement = sum(a == b for a, b in zip(mine, v1, strict=True)) / len(mine)
        return f" Agrees with v1 on {agreement:.4f} of test rows."


class FraudV3(FraudV1Torch):
    version = "3"
    faulty = True
    summary = (
        f"fraud v1's weights as TorchScript, deliberately faulty: a batch with any row whose "
        f"features[0] < {FAULT_BELOW} (about a fifth of inputs) fails."
    )


class FraudLiteV1(_FraudBuilder):
    name = "fraud-lite"
    version = "1"
    training = LITE
    runtime: ClassVar[RuntimeKind] = "onnx"
    summary = "Logistic regression 64-2 (softmax), the fallback of fraud; ONNX."


FRAUD_BUILDERS: tuple[type[ModelBuilder], ...] = (
    FraudV1,
    FraudV1Torch,
    FraudV2,
    FraudV3,
    FraudLiteV1,
)
