"""The model runtime interface: load an artifact onto a device, infer a batch, unload.

Two methods are required (`load`, `infer`); the `on_*` hooks are optional. Compute never runs on
the event loop: implementations hand it to an executor they own.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import numpy.typing as npt

from tidegate.models.manifest import ModelPackage

__all__ = ["Arrays", "ModelRuntime"]

Arrays = Mapping[str, npt.NDArray[Any]]


class ModelRuntime(ABC):
    """One loaded model version. Inputs and outputs are batched along the first dimension."""

    device: str = "cpu"

    @abstractmethod
    async def load(self, package: ModelPackage) -> None:
        """Load the verified package onto the best device available (CUDA when present)."""

    @abstractmethod
    async def infer(self, inputs: Arrays) -> dict[str, npt.NDArray[Any]]:
        """Run one batch. Every output has as many rows as the inputs."""

    async def on_warmup(self) -> None:  # noqa: B027 - optional hook, no-op by default
        """Run once after `load`, before any request is routed to this version."""

    async def on_unload(self) -> None:  # noqa: B027 - optional hook, no-op by default
        """Release the model and its device memory."""

    def abandon(self) -> None:  # noqa: B027 - optional hook, no-op by default
        """A call ran past its timeout and its caller gave up on it: later calls must not wait
        behind it (a runtime with its own thread moves to a fresh one)."""
