"""The manifest of one model version in the artifact store."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tidegate.schemas.signature import Signature

__all__ = ["Manifest", "ModelPackage", "RuntimeKind", "TaskKind"]

RuntimeKind = Literal["onnx", "torch"]
TaskKind = Literal["classifier", "embedding"]


class Manifest(BaseModel):
    """What a model version is: its files (by sha256), runtime, entry point and V2 signature.

    `preprocess` and `postprocess` name steps that belong to the model's package, such as
    tokenizing a BYTES input, so the worker never needs model-specific code.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")
    version: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    runtime: RuntimeKind
    entrypoint: str = Field(description="The model file among `files`, e.g. model.onnx.")
    files: dict[str, str] = Field(description="Relative path to sha256 hex digest.")
    signature: Signature
    preprocess: dict[str, Any] | None = None
    postprocess: dict[str, Any] | None = None
    task: TaskKind | None = Field(
        None,
        description="What the outputs mean, so shadow runs compare them fittingly: class "
        "probabilities (argmax agreement) or embeddings (cosine). None: guessed from the "
        "signature.",
    )
    description: str = ""
    created_at: datetime | None = None


class ModelPackage(BaseModel):
    """A manifest whose files have been fetched into `directory` and verified."""

    model_config = ConfigDict(frozen=True)

    manifest: Manifest
    directory: Path

    def path(self, relative: str) -> Path:
        return self.directory / relative
