"""Model signatures (V2 names, datatypes and shapes) and validation of request inputs against them.

Both adapters validate with this one module: the gateway before it publishes anything, the worker
before it computes. A mismatch is an `InvalidInputError` naming the field at fault.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tidegate.core.errors import InvalidInputError
from tidegate.schemas.tensors import DATATYPES

__all__ = ["Signature", "TensorSpec", "validate_inputs"]


class TensorSpec(BaseModel):
    """One input or output. A dimension of -1 accepts any size (the batch dimension, usually)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    datatype: str
    shape: tuple[int, ...]

    @field_validator("datatype")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in DATATYPES:
            raise ValueError(f"unknown V2 datatype {value}")
        return value

    def accepts(self, shape: Sequence[int]) -> bool:
        return len(shape) == len(self.shape) and all(
            want in (-1, got) for want, got in zip(self.shape, shape, strict=True)
        )


class Signature(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    inputs: tuple[TensorSpec, ...] = Field(min_length=1)
    outputs: tuple[TensorSpec, ...] = Field(min_length=1)

    def input(self, name: str) -> TensorSpec | None:
        return next((spec for spec in self.inputs if spec.name == name), None)


def validate_inputs(signature: Signature, tensors: Sequence[Mapping[str, Any]]) -> None:
    """Check names, datatypes and shapes of request tensors (records or V2 JSON dicts)."""
    seen: set[str] = set()
    for tensor in tensors:
        name = str(tensor.get("name"))
        spec = signature.input(name)
        if spec is None:
            expected = ", ".join(s.name for s in signature.inputs)
            raise InvalidInputError(f"unexpected input {name!r}; the model takes {expected}", name)
        if name in seen:
            raise InvalidInputError(f"input {name!r} is given twice", name)
        seen.add(name)
        if tensor.get("datatype") != spec.datatype:
            raise InvalidInputError(
                f"input {name!r} must be {spec.datatype}, got {tensor.get('datatype')}", name
            )
        shape = [int(d) for d in tensor.get("shape", [])]
        if not spec.accepts(shape):
            raise InvalidInputError(
                f"input {name!r} must have shape {list(spec.shape)} (-1: any), got {shape}", name
            )
    missing = [s.name for s in signature.inputs if s.name not in seen]
    if missing:
        raise InvalidInputError(f"missing input {missing[0]!r}", missing[0])
