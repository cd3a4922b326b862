"""Requests in JSON Lines files, as `tidegate produce` reads them: one JSON object a line.

    {"model": "fraud", "version": "2", "routing_key": "card-42", "id": "r-1",
     "inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 64], "data": [...]}],
     "outputs": ["probabilities"], "parameters": {"priority": 1}, "tenant": "acme"}

Only `model` and `inputs` are required; inputs are V2 JSON tensors (flat or nested data, BYTES as
strings). Each line is checked on its own and a bad one is reported with the reason.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tidegate.core.errors import InvalidInputError
from tidegate.schemas.v2 import V2Input, scalar_parameters, tensor_records

__all__ = ["LineRequest", "parse_line"]


class LineRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    version: str | None = None
    routing_key: str | None = None
    tenant: str | None = None
    id: str | None = None
    inputs: list[V2Input] = Field(min_length=1)
    outputs: list[str] = Field(default_factory=list)
    parameters: dict[str, Any] = Field(default_factory=dict)


def parse_line(text: str, default_tenant: str = "default") -> dict[str, Any]:
    """Keyword arguments of `TidegateProducer.publish` for one line; `InvalidInputError` if bad."""
    try:
        line = LineRequest.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or None
        where = f" at {field}" if field else ""
        raise InvalidInputError(f"{first['msg']}{where}", field) from None
    return {
        "model": line.model,
        "inputs": tensor_records(line.inputs),
        "version": line.version,
        "routing_key": line.routing_key,
        "tenant": line.tenant or default_tenant,
        "request_id": line.id,
        "outputs": line.outputs,
        "parameters": scalar_parameters(line.parameters, "parameters"),
    }
