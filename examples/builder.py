"""The example-model builder interface."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

from tidegate.models.manifest import Manifest

__all__ = ["ModelBuilder"]


class ModelBuilder(ABC):
    """Builds one model version into a directory.

    `recipe` is everything that decides the artifact's bytes (seeds, epochs, sources): it is
    stored as the package's `build.json`, so an unchanged recipe means an unchanged version and
    the build is skipped without retraining. Builders are CPU-bound offline work, so they are
    synchronous; `build_models` runs them in a thread.
    """

    name: ClassVar[str]
    version: ClassVar[str]

    @abstractmethod
    def recipe(self) -> dict[str, Any]:
        """JSON-serialisable inputs of the build; the same recipe must give the same bytes."""

    @abstractmethod
    def build(self, workdir: Path) -> Manifest:
        """Write the model's files into `workdir`; return its manifest (hashes may be empty)."""
