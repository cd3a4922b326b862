"""The signature check of each request a worker computes, done once per combination of a model
version and its requests' tensor names, datatypes and shapes."""

from __future__ import annotations

from collections.abc import Hashable

from tidegate.agents.inference.loaded import LoadedModel
from tidegate.core.errors import InvalidInputError
from tidegate.schemas.records import RequestRecord
from tidegate.schemas.signature import validate_inputs

__all__ = ["SignatureChecks"]


class SignatureChecks:
    """Requests that passed the signature check, by model version and the names, datatypes and
    shapes of their tensors: those decide the check, so each combination is checked once."""

    _MAX = 4096

    def __init__(self) -> None:
        self._passed: dict[Hashable, tuple[str, ...]] = {}

    def outputs(self, model: LoadedModel, request: RequestRecord) -> tuple[str, ...]:
        """The outputs the request gets; `InvalidInputError` when it does not fit the model."""
        inputs = request["inputs"]
        asked = request.get("outputs")
        key = (
            model.name,
            model.version,
            tuple((t["name"], t["datatype"], tuple(t["shape"])) for t in inputs),
            tuple(asked) if asked else None,
        )
        wanted = self._passed.get(key)
        if wanted is not None:
            return wanted
        validate_inputs(model.signature, inputs)
        known = [spec.name for spec in model.signature.outputs]
        wanted = tuple(asked or known)
        for name in wanted:
            if name not in known:
                raise InvalidInputError(f"unknown output {name!r}; the model gives {known}", name)
        if len(self._passed) >= self._MAX:
            self._passed.clear()  # unbounded shapes must not grow the worker's memory
        self._passed[key] = wanted
        return wanted
