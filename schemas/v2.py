"""Open Inference Protocol (V2) requests: the JSON model, and conversion into `Tensor` records.

Input `data` may be flat or nested (row-major either way); BYTES elements are JSON strings. A tensor
whose `parameters.binary_data_size` is set takes its raw bytes from the binary section of the body
instead (`tidegate.schemas.v2_binary`). Requested outputs are kept once each, in the order first
asked, with the parameters of their first mention. Every check names the field at fault: the
signature check of `tidegate.schemas.signature` first (names, datatypes, shapes), then the data
against its shape.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, cast

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tidegate.core.errors import InvalidInputError, MalformedRequestError
from tidegate.schemas.records import Datatype, TensorRecord
from tidegate.schemas.signature import Signature, validate_inputs
from tidegate.schemas.tensors import DATATYPES, encode_bytes_elements, to_numpy
from tidegate.schemas.v2_binary import BinarySection

__all__ = [
    "BINARY_DATA_SIZE",
    "Scalar",
    "V2Input",
    "V2Output",
    "V2Request",
    "input_records",
    "parse_request",
    "scalar_parameters",
    "tensor_records",
]

BINARY_DATA_SIZE = "binary_data_size"
Scalar = bool | int | float | str | None
# Transport-only parameters: they describe this HTTP body and mean nothing on Kafka.
_TRANSPORT = frozenset({BINARY_DATA_SIZE, "binary_data", "binary_data_output"})


class V2Input(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    shape: list[int]
    datatype: str
    parameters: dict[str, Any] = Field(default_factory=dict)
    data: Any = None


class V2Output(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    parameters: dict[str, Any] = Field(default_factory=dict)


class V2Request(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str | None = None
    parameters: dict[str, Any] = Field(default_factory=dict)
    inputs: list[V2Input] = Field(min_length=1)
    outputs: list[V2Output] | None = None

    @field_validator("outputs")
    @classmethod
    def _once_each(cls, outputs: list[V2Output] | None) -> list[V2Output] | None:
        """An output asked for again is returned once, as the first mention of it asks."""
        if outputs is None:
            return None
        first: dict[str, V2Output] = {}
        for output in outputs:
            first.setdefault(output.name, output)
        return list(first.values())


def parse_request(header: bytes) -> V2Request:
    """Parse the JSON header; bad JSON is `MalformedRequestError`, a bad shape of it invalid."""
    try:
        return V2Request.model_validate_json(header)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or None
        if first["type"] == "json_invalid":
            raise MalformedRequestError(f"the body is not valid JSON: {first['msg']}") from None
        where = f" at {field}" if field else ""
        raise InvalidInputError(
            f"not a V2 inference request{where}: {first['msg']}", field
        ) from None


def scalar_parameters(params: Mapping[str, Any], where: str) -> dict[str, Scalar]:
    """Parameters to forward on Kafka, which carries only null, boolean, number and string."""
    out: dict[str, Scalar] = {}
    for key, value in params.items():
        if key in _TRANSPORT:
            continue
        if value is not None and not isinstance(value, bool | int | float | str):
            raise InvalidInputError(f"parameter {key!r} must be a scalar", f"{where}.{key}")
        out[key] = value
    return out


def _json_numbers(tensor: V2Input, count: int) -> bytes:
    dtype = DATATYPES[tensor.datatype]
    try:
        array = np.asarray(tensor.data)
    except ValueError:
        array = np.asarray(None, dtype=object)
    if array.size != count or array.dtype.kind not in "biuf":
        if array.dtype.kind in "biuf":
            problem = f"{array.size} elements for shape {tensor.shape}"
        else:
            problem = "elements that are not numbers (or nested lists of uneven length)"
        raise InvalidInputError(f"data of input {tensor.name!r} has {problem}", tensor.name)
    if count and (
        (dtype.kind == "b" and array.dtype.kind != "b")
        or (dtype.kind in "iu" and array.dtype.kind not in "biu")
        or (dtype.kind in "iu" and not _fits(array, dtype))
    ):
        raise InvalidInputError(
            f"data of input {tensor.name!r} does not fit {tensor.datatype}", tensor.name
        )
    return np.ascontiguousarray(array, dtype=dtype).tobytes()


def _fits(array: np.ndarray[Any, Any], dtype: np.dtype[Any]) -> bool:
    info = np.iinfo(dtype)
    return bool(array.min() >= info.min and array.max() <= info.max)


def _flatten(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def _json_bytes(tensor: V2Input, count: int) -> bytes:
    items = _flatten(tensor.data)
    if not all(isinstance(item, str) for item in items):
        raise InvalidInputError(f"data of BYTES input {tensor.name!r} must be strings", tensor.name)
    if len(items) != count:
        raise InvalidInputError(
            f"data of input {tensor.name!r} has {len(items)} elements for shape {tensor.shape}",
            tensor.name,
        )
    return encode_bytes_elements(items)


def _record(tensor: V2Input, binary: BinarySection, index: int) -> TensorRecord:
    where = f"inputs.{index}"
    if any(dim < 0 for dim in tensor.shape):
        raise InvalidInputError(
            f"input {tensor.name!r} has a negative dimension in {tensor.shape}", tensor.name
        )
    size = tensor.parameters.get(BINARY_DATA_SIZE)
    count = math.prod(tensor.shape)
    if size is not None:
        if tensor.data is not None:
            raise InvalidInputError(
                f"input {tensor.name!r} has both data and {BINARY_DATA_SIZE}", tensor.name
            )
        data = binary.take(size, f"{where}.parameters.{BINARY_DATA_SIZE}")
    elif tensor.data is None:
        raise InvalidInputError(f"input {tensor.name!r} has no data", tensor.name)
    elif tensor.datatype == "BYTES":
        data = _json_bytes(tensor, count)
    else:
        data = _json_numbers(tensor, count)
    record: TensorRecord = {
        "name": tensor.name,
        # An unknown datatype is refused below, by the decoding.
        "datatype": cast(Datatype, tensor.datatype),
        "shape": list(tensor.shape),
        "data": data,
        "parameters": scalar_parameters(tensor.parameters, f"{where}.parameters"),
    }
    # Decoding checks the data against shape and datatype (count, byte size, BYTES framing).
    to_numpy(record)
    return record


def tensor_records(inputs: list[V2Input]) -> list[TensorRecord]:
    """JSON tensors as `Tensor` records, checked against their own shapes only (no signature)."""
    return [_record(tensor, BinarySection(b""), i) for i, tensor in enumerate(inputs)]


def input_records(
    request: V2Request, binary: BinarySection, signature: Signature
) -> list[TensorRecord]:
    """The inputs as `Tensor` records, checked against the signature; nothing invalid passes."""
    validate_inputs(
        signature,
        [{"name": t.name, "datatype": t.datatype, "shape": t.shape} for t in request.inputs],
    )
    records = [_record(tensor, binary, i) for i, tensor in enumerate(request.inputs)]
    binary.check_consumed()
    known = {spec.name for spec in signature.outputs}
    for i, output in enumerate(request.outputs or []):
        if output.name not in known:
            raise InvalidInputError(
                f"unknown output {output.name!r}; the model gives {', '.join(sorted(known))}",
                f"outputs.{i}.name",
            )
    return records
