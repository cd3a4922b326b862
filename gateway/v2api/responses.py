"""`InferenceResult` records as HTTP responses: V2 JSON, Triton binary outputs, or a problem.

Which outputs come back, and which of them as binary, is the caller's choice recorded in
`OutputPrefs`: per output `parameters.binary_data`, else the request-level `binary_data_output`.
An output that JSON cannot carry (BYTES that are not UTF-8, a datatype JSON has no numbers for)
is sent binary whatever was asked, which V2 clients read either way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from fastapi.responses import JSONResponse, Response

from tidegate.core.errors import InvalidInputError
from tidegate.gateway.problems import result_problem
from tidegate.schemas.records import ResultRecord, TensorRecord
from tidegate.schemas.tensors import DATATYPES, decode_bytes_elements
from tidegate.schemas.v2 import BINARY_DATA_SIZE, V2Request
from tidegate.schemas.v2_binary import HEADER_LENGTH, join_body

__all__ = ["OutputPrefs", "render_result", "v2_response"]


@dataclass(frozen=True)
class OutputPrefs:
    """The outputs a caller asked for (none named: all) and how each is to be sent."""

    names: tuple[str, ...] = ()
    binary: Mapping[str, bool] = field(default_factory=dict)
    binary_default: bool = False

    @classmethod
    def from_request(cls, request: V2Request) -> OutputPrefs:
        outputs = request.outputs or []
        return cls(
            names=tuple(o.name for o in outputs),
            binary={
                o.name: bool(o.parameters["binary_data"])
                for o in outputs
                if "binary_data" in o.parameters
            },
            binary_default=bool(request.parameters.get("binary_data_output", False)),
        )

    def to_meta(self) -> dict[str, Any]:
        return {
            "names": list(self.names),
            "binary": dict(self.binary),
            "binary_default": self.binary_default,
        }

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any] | None) -> OutputPrefs:
        if not meta:
            return cls()
        return cls(
            names=tuple(meta.get("names", ())),
            binary=dict(meta.get("binary", {})),
            binary_default=bool(meta.get("binary_default", False)),
        )

    def wants(self, name: str) -> bool:
        return not self.names or name in self.names

    def wants_binary(self, name: str) -> bool:
        return self.binary.get(name, self.binary_default)


def _json_data(tensor: TensorRecord) -> list[Any] | None:
    """The elements as a flat JSON list, or None when JSON cannot carry them."""
    datatype, data = tensor["datatype"], tensor["data"]
    if datatype == "BYTES":
        count = math.prod(tensor["shape"])
        try:
            return [item.decode() for item in decode_bytes_elements(data, count, tensor["name"])]
        except (UnicodeDecodeError, InvalidInputError):
            return None
    dtype = DATATYPES.get(datatype)
    if dtype is None or len(data) % dtype.itemsize:
        return None
    array = np.frombuffer(data, dtype=dtype)
    # JSON has no NaN or infinity; such outputs travel binary.
    if dtype.kind == "f" and not np.isfinite(array).all():
        return None
    values: list[Any] = array.tolist()
    return values


def _output(tensor: TensorRecord, binary: bool) -> tuple[dict[str, Any], bytes | None]:
    entry: dict[str, Any] = {
        "name": tensor["name"],
        "datatype": tensor["datatype"],
        "shape": list(tensor["shape"]),
    }
    params = dict(tensor.get("parameters") or {})
    values = None if binary else _json_data(tensor)
    if values is None:
        params[BINARY_DATA_SIZE] = len(tensor["data"])
        raw: bytes | None = bytes(tensor["data"])
    else:
        entry["data"] = values
        raw = None
    if params:
        entry["parameters"] = params
    return entry, raw


def v2_response(result: ResultRecord, prefs: OutputPrefs) -> tuple[dict[str, Any], list[bytes]]:
    """The V2 response JSON of an OK result, and the binary parts that follow it, in order."""
    outputs: list[dict[str, Any]] = []
    parts: list[bytes] = []
    for tensor in result.get("outputs") or []:
        if not prefs.wants(tensor["name"]):
            continue
        entry, raw = _output(tensor, prefs.wants_binary(tensor["name"]))
        outputs.append(entry)
        if raw is not None:
            parts.append(raw)
    body: dict[str, Any] = {
        "model_name": result["model"],
        "model_version": result.get("model_version"),
        "id": result["request_id"],
        "outputs": outputs,
    }
    # Said only when it is news, so a plain answer stays as small as V2 makes it.
    rule = result.get("routing_rule")
    if result.get("cached") or (rule is not None and rule.startswith("fallback:")):
        body["parameters"] = _said(result)
    return body, parts


def _said(result: ResultRecord) -> dict[str, Any]:
    said: dict[str, Any] = {}
    if result.get("cached"):
        said["cached"] = True
    rule = result.get("routing_rule")
    if rule is not None and rule.startswith("fallback:"):
        said["routing_rule"] = rule
    return said


def render_result(result: ResultRecord, prefs: OutputPrefs, *, instance: str) -> Response:
    """The HTTP answer to a result: 200 with V2 outputs, or the problem its status maps to."""
    if result.get("status") != "OK":
        return result_problem(result, instance=instance)
    body, parts = v2_response(result, prefs)
    if not parts:
        return JSONResponse(body)
    content, header_length = join_body(body, parts)
    return Response(
        content,
        media_type="application/octet-stream",
        headers={HEADER_LENGTH: str(header_length)},
    )
