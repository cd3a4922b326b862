"""Pre- and post-processing steps that ship with a model package.

A manifest's `preprocess` and `postprocess` name one step each; the runtime applies them around
the graph, so the worker never holds model-specific code. Steps:

* `{"kind": "tokenizer", "file": "tokenizer.json", "max_length": 128, "input": "text"}` turns a
  BYTES tensor of UTF-8 texts into `input_ids`, `attention_mask` and `token_type_ids` (int64,
  padded to the longest text of the batch, truncated to `max_length` tokens).
* `{"kind": "rename", "outputs": {"sentence_embedding": "embedding"}}` renames graph outputs to
  the names of the signature.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tidegate.core.errors import ArtifactError, InvalidInputError
from tidegate.models.manifest import Manifest
from tidegate.schemas.signature import Signature

__all__ = ["TOKEN_INPUTS", "Pipeline", "RenameStep", "Step", "TokenizerStep", "build_pipeline"]

Batch = dict[str, npt.NDArray[Any]]
TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class Step(ABC):
    """One transformation of a batch of named arrays."""

    @abstractmethod
    def apply(self, arrays: Batch) -> Batch:
        """Return the transformed batch; inputs the step does not use pass through."""

    def model_inputs(self, names: list[str]) -> list[str]:
        """The input names after this step, in order (for runtimes that pass them by position)."""
        return names


class _TokenizerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["tokenizer"]
    file: str
    input: str
    max_length: int = Field(128, ge=1, le=8192)


class _RenameConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["rename"]
    outputs: dict[str, str]


class TokenizerStep(Step):
    def __init__(self, config: _TokenizerConfig, directory: Path) -> None:
        from tokenizers import Tokenizer

        self.input = config.input
        self._tokenizer = Tokenizer.from_file(str(directory / config.file))
        self._tokenizer.enable_truncation(config.max_length)
        # The file may pad to a fixed length; a batch needs only its longest text.
        padding = self._tokenizer.padding or {}
        self._tokenizer.enable_padding(
            pad_id=int(padding.get("pad_id", 0)),
            pad_type_id=int(padding.get("pad_type_id", 0)),
            pad_token=str(padding.get("pad_token", "[PAD]")),
        )

    def apply(self, arrays: Batch) -> Batch:
        if self.input not in arrays:
            raise InvalidInputError(f"missing input {self.input!r}", self.input)
        texts = [_text(item, self.input) for item in arrays[self.input].reshape(-1)]
        encodings = self._tokenizer.encode_batch(texts)
        out = {name: array for name, array in arrays.items() if name != self.input}
        width = len(encodings[0].ids) if encodings else 0
        attributes = ("ids", "attention_mask", "type_ids")
        for name, attribute in zip(TOKEN_INPUTS, attributes, strict=True):
            rows = [getattr(encoding, attribute) for encoding in encodings]
            out[name] = np.array(rows, dtype=np.int64).reshape(len(encodings), width)
        return out

    def model_inputs(self, names: list[str]) -> list[str]:
        at = names.index(self.input) if self.input in names else len(names)
        return [*names[:at], *TOKEN_INPUTS, *names[at + 1 :]]


class RenameStep(Step):
    def __init__(self, config: _RenameConfig) -> None:
        self.outputs = dict(config.outputs)

    def apply(self, arrays: Batch) -> Batch:
        return {self.outputs.get(name, name): array for name, array in arrays.items()}


class Pipeline:
    """The package's steps around the graph: `before` on inputs, `after` on outputs."""

    def __init__(self, pre: Step | None = None, post: Step | None = None) -> None:
        self.pre = pre
        self.post = post

    def before(self, arrays: Batch) -> Batch:
        return self.pre.apply(arrays) if self.pre else arrays

    def after(self, arrays: Batch) -> Batch:
        return self.post.apply(arrays) if self.post else arrays

    def model_inputs(self, signature: Signature) -> list[str]:
        names = [spec.name for spec in signature.inputs]
        return self.pre.model_inputs(names) if self.pre else names


def build_pipeline(manifest: Manifest, directory: Path) -> Pipeline:
    """The steps a manifest names; an unknown or malformed step is an `ArtifactError`."""
    return Pipeline(
        pre=_step(manifest, "preprocess", manifest.preprocess, directory),
        post=_step(manifest, "postprocess", manifest.postprocess, directory),
    )


def _step(
    manifest: Manifest, where: str, config: dict[str, Any] | None, directory: Path
) -> Step | None:
    if not config:
        return None
    label = f"{manifest.name} version {manifest.version} {where}"
    try:
        kind = config.get("kind")
        if kind == "tokenizer":
            tokenizer = _TokenizerConfig.model_validate(config)
            if manifest.signature.input(tokenizer.input) is None:
                raise ArtifactError(f"{label}: {tokenizer.input!r} is not a signature input")
            return TokenizerStep(tokenizer, directory)
        if kind == "rename":
            return RenameStep(_RenameConfig.model_validate(config))
    except ValidationError as exc:
        raise ArtifactError(f"{label} is malformed: {exc}") from exc
    except Exception as exc:  # the tokenizers package raises its own exception types
        if isinstance(exc, ArtifactError):
            raise
        raise ArtifactError(f"{label} cannot be built: {exc}") from exc
    raise ArtifactError(f"{label}: unknown step kind {kind!r} (tokenizer, rename)")


def _text(item: Any, name: str) -> str:
    if isinstance(item, str):
        return item
    try:
        return bytes(item).decode("utf-8")
    except (UnicodeDecodeError, TypeError) as exc:
        raise InvalidInputError(f"input {name!r} must hold UTF-8 texts: {exc}", name) from exc
