"""The `fraud` example models: a card-fraud classifier trained on seeded synthetic transactions.

Each transaction has 64 standard-normal features. It is fraud when a fixed score (a sparse
linear part plus a product, a square and an absolute value, so an MLP beats a linear model)
is in its top fifth. Training is a few seconds of CPU, with fixed seeds and epochs.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from tidegate.examples.export import single_thread

__all__ = [
    "FAULT_BELOW",
    "FEATURES",
    "FaultyFraud",
    "FraudLinear",
    "FraudMLP",
    "TrainedModel",
    "TrainingRecipe",
    "dataset",
    "train",
]

FEATURES = 64
DATA_SEED = 1234
TRAIN_ROWS = 20_000
TEST_ROWS = 4_000
# v3 fails rows whose first feature is below this: about the lowest fifth (19.9%) of a standard
# normal. A binary fraction, so the error message prints it exactly.
FAULT_BELOW = -0.84375


class FraudMLP(nn.Module):
    """64 -> 256 -> 256 -> 2, softmax inside the graph: it outputs class probabilities."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(FEATURES, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 2)
        )

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        return self.layers(features)  # type: ignore[no-any-return]

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.layers(features), dim=1)


class FraudLinear(nn.Module):
    """Logistic regression (two-class softmax): the cheap fallback, `fraud-lite`."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(FEATURES, 2)

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear(features)  # type: ignore[no-any-return]

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.linear(features), dim=1)


class FaultyFraud(nn.Module):
    """v1's weights, but the batch fails when any row's first feature is below `FAULT_BELOW`
    (about a fifth of inputs): a deterministic model error to exercise failure handling."""

    def __init__(self, model: FraudMLP) -> None:
        super().__init__()
        self.model = model
        self.threshold = FAULT_BELOW  # an attribute: TorchScript cannot close over globals

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        faulty = features[:, 0] < self.threshold
        if bool(faulty.any()):
            count = str(int(faulty.sum()))
            limit = str(self.threshold)
            raise RuntimeError("fraud v3 fault: " + count + " row(s) have features[0] < " + limit)
        return self.model(features)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class TrainingRecipe:
    kind: str  # "mlp" or "linear"
    seed: int
    epochs: int
    learning_rate: float
    batch_size: int


@dataclass(frozen=True)
class TrainedModel:
    module: nn.Module
    accuracy: float
    predictions: tuple[int, ...]  # on the test split, to compare versions

    def describe(self, recipe: TrainingRecipe) -> dict[str, Any]:
        return {**asdict(recipe), "test_accuracy": round(self.accuracy, 4)}


def dataset(rows: int, seed: int = DATA_SEED) -> tuple[npt.NDArray[np.float32], npt.NDArray[Any]]:
    """Features and labels (1: fraud); the first `TRAIN_ROWS` train, the rest test."""
    rng = np.random.default_rng(seed)
    weights = np.zeros(FEATURES)
    weights[:16] = rng.standard_normal(16) / 2
    features = rng.standard_normal((rows, FEATURES)).astype(np.float32)
    x = features.astype(np.float64)
    score = x @ weights + 1.5 * x[:, 0] * x[:, 1] + 0.8 * (x[:, 2] ** 2 - 1) - np.abs(x[:, 3])
    labels = (score > np.quantile(score, 0.8)).astype(np.int64)
    return features, labels


@functools.lru_cache(maxsize=8)
def train(recipe: TrainingRecipe) -> TrainedModel:
    """Train once per recipe and process: `fraud` 1, 1-torch and 3 share v1's weights."""
    features, labels = dataset(TRAIN_ROWS + TEST_ROWS)
    x, y = torch.from_numpy(features), torch.from_numpy(labels)
    x_train, y_train = x[:TRAIN_ROWS], y[:TRAIN_ROWS]
    x_test, y_test = x[TRAIN_ROWS:], y[TRAIN_ROWS:]
    with single_thread():
        torch.manual_seed(recipe.seed)
        model: FraudMLP | FraudLinear = FraudMLP() if recipe.kind == "mlp" else FraudLinear()
        optimizer = torch.optim.Adam(model.parameters(), lr=recipe.learning_rate)
        order = torch.Generator().manual_seed(recipe.seed)
        model.train()
        for _ in range(recipe.epochs):
            permutation = torch.randperm(TRAIN_ROWS, generator=order)
            for start in range(0, TRAIN_ROWS, recipe.batch_size):
                rows = permutation[start : start + recipe.batch_size]
                loss = nn.functional.cross_entropy(model.logits(x_train[rows]), y_train[rows])
                optimizer.zero_grad()
                loss.backward()  # type: ignore[no-untyped-call]
                optimizer.step()
        model.eval()
        with torch.inference_mode():
            predicted = model.logits(x_test).argmax(dim=1)
    accuracy = float((predicted == y_test).float().mean())
    return TrainedModel(model, accuracy, tuple(int(p) for p in predicted))
