"""The bodies and headers the gateway's OpenAPI documents (`tidegate.gateway.openapi.openapi_docs`).

Each schema is the shape the code really writes, so schemathesis's response check holds the two
together: `Problem` is what `tidegate.gateway.problems.problem` renders, the V2 bodies are those of
`tidegate.gateway.v2api.routes` and `tidegate.gateway.v2api.responses`, and the inference request is
the `V2Request` model the gateway parses with. Each response builder returns fresh dicts, since the
caller edits them in place.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from tidegate.gateway.v2api.call_record import REQUEST_TIMEOUT
from tidegate.schemas.v2 import V2Request
from tidegate.schemas.v2_binary import HEADER_LENGTH

__all__ = [
    "COMPONENTS",
    "PROBLEM_REF",
    "fetched",
    "header",
    "infer_body",
    "infer_headers",
    "inference",
    "json_object",
    "live",
    "metrics",
    "model_metadata",
    "model_ready",
    "ready",
    "server_metadata",
]

Responses = dict[str, dict[str, Any]]


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


PROBLEM_REF = _ref("Problem")
_STR = {"type": "string"}
_TENSOR: dict[str, Any] = {
    "type": "object",
    "required": ["name", "datatype", "shape"],
    "properties": {
        "name": _STR,
        "datatype": _STR,
        "shape": {"type": "array", "items": {"type": "integer"}},
    },
}
_V2_REQUEST = V2Request.model_json_schema(ref_template="#/components/schemas/{model}")

COMPONENTS: dict[str, dict[str, Any]] = {
    "Problem": {
        "type": "object",
        "description": "RFC 9457 problem details; `error` repeats `detail` for V2 clients.",
        "required": ["type", "title", "status", "detail", "instance"],
        "properties": {
            "type": _STR,
            "title": _STR,
            "status": {"type": "integer", "minimum": 100, "maximum": 599},
            "detail": _STR,
            "instance": _STR,
            "error": _STR,
            "code": _STR,
            "retriable": {"type": "boolean"},
            "field": _STR,
            "request_id": _STR,
        },
        "additionalProperties": True,
    },
    "TensorMetadata": _TENSOR,
    "V2OutputTensor": {
        "type": "object",
        "required": ["name", "datatype", "shape"],
        "properties": {
            **_TENSOR["properties"],
            "data": {"type": "array"},
            "parameters": {"type": "object"},
        },
    },
    "V2InferenceResponse": {
        "type": "object",
        "required": ["model_name", "id", "outputs"],
        "properties": {
            "model_name": _STR,
            "model_version": {"type": ["string", "null"]},
            "id": _STR,
            "outputs": {"type": "array", "items": _ref("V2OutputTensor")},
            "parameters": {
                "type": "object",
                "description": "`cached`: true for an answer from the prediction cache; "
                "`routing_rule`: `fallback:<reason>@<model>` for an answer of the model's "
                "declared fallback.",
                "properties": {"cached": {"type": "boolean"}, "routing_rule": _STR},
            },
        },
    },
    "V2Pending": {
        "type": "object",
        "required": ["id", "status"],
        "properties": {"id": _STR, "model_name": _STR, "status": {"const": "PENDING"}},
    },
    "V2ModelMetadata": {
        "type": "object",
        "required": ["name", "versions", "platform", "inputs", "outputs"],
        "properties": {
            "name": _STR,
            "versions": {"type": "array", "items": _STR},
            "platform": _STR,
            "inputs": {"type": "array", "items": _ref("TensorMetadata")},
            "outputs": {"type": "array", "items": _ref("TensorMetadata")},
        },
    },
    "V2ServerMetadata": {
        "type": "object",
        "required": ["name", "version", "extensions"],
        "properties": {
            "name": _STR,
            "version": _STR,
            "extensions": {"type": "array", "items": _STR},
        },
    },
    "V2ModelReady": {
        "type": "object",
        "required": ["name", "ready"],
        "properties": {"name": _STR, "version": _STR, "ready": {"const": True}},
    },
    **{name: schema for name, schema in _V2_REQUEST.pop("$defs").items()},
    "V2Request": _V2_REQUEST,
}


def header(description: str, kind: str = "string", *, required: bool = True) -> dict[str, Any]:
    return {"description": description, "required": required, "schema": {"type": kind}}


def _json(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def live(_method: str, _path: str) -> Responses:
    schema = {"type": "object", "required": ["live"], "properties": {"live": {"const": True}}}
    return {"200": _json("The process is up.", schema)}


def ready(_method: str, _path: str) -> Responses:
    schema = {"type": "object", "required": ["ready"], "properties": {"ready": {"const": True}}}
    return {"200": _json("Producer connected and a reply partition leased.", schema)}


def metrics(_method: str, _path: str) -> Responses:
    media = CONTENT_TYPE_LATEST.split(";", 1)[0]
    text = {"description": "Prometheus text exposition.", "content": {media: {"schema": _STR}}}
    return {"200": text}


def server_metadata(_method: str, _path: str) -> Responses:
    return {"200": _json("V2 server metadata.", _ref("V2ServerMetadata"))}


def model_metadata(_method: str, _path: str) -> Responses:
    return {"200": _json("V2 model metadata.", _ref("V2ModelMetadata"))}


def model_ready(_method: str, _path: str) -> Responses:
    return {"200": _json("A worker has the version loaded and warm.", _ref("V2ModelReady"))}


def _result(description: str) -> dict[str, Any]:
    binary = {
        "schema": {"type": "string", "format": "binary"},
        "description": f"Triton's binary extension: JSON of {HEADER_LENGTH} bytes, then tensors.",
    }
    return {
        "description": description,
        "content": {
            "application/json": {"schema": _ref("V2InferenceResponse")},
            "application/octet-stream": binary,
        },
        "headers": {
            HEADER_LENGTH: header(
                "Length of the JSON part (binary bodies only).", "integer", required=False
            )
        },
    }


def _pending(description: str, *extra: str) -> dict[str, Any]:
    headers = {"Location": header("Where the result is fetched.")}
    for name in extra:
        headers[name] = header(name)
    return {**_json(description, _ref("V2Pending")), "headers": headers}


def inference(_method: str, _path: str) -> Responses:
    return {
        "200": _result("The outputs."),
        "202": _pending(
            "Accepted (`Prefer: respond-async`): poll the Location.", "Preference-Applied"
        ),
    }


def fetched(_method: str, _path: str) -> Responses:
    return {"200": _result("The result."), "202": _pending("Not answered yet.", "Retry-After")}


def json_object(method: str, path: str) -> Responses:
    """/admin and /admin/dlq: FastAPI's schema of the return type; more statuses where the
    handler chooses them (a registration that added a version, a redrive left running)."""
    out: Responses = {"200": {"description": "Done."}}
    if method == "post" and path == "/admin/models/{name}/versions":
        out["201"] = _json("A version was registered.", {"type": "object"})
    if method == "post" and path == "/admin/dlq/redrive":
        out["202"] = {
            **_json("Started; poll the Location.", {"type": "object"}),
            "headers": {"Location": header("The job.")},
        }
    return out


_FRAUD_REQUEST = {
    "inputs": [
        {"name": "features", "datatype": "FP32", "shape": [1, 4], "data": [0.1, 0.2, 0.3, 0.4]}
    ]
}


def infer_body() -> dict[str, Any]:
    binary = {"schema": {"type": "string", "format": "binary"}}
    return {
        "required": True,
        "content": {
            "application/json": {"schema": _ref("V2Request"), "example": _FRAUD_REQUEST},
            "application/octet-stream": binary,
        },
    }


def infer_headers() -> list[dict[str, Any]]:
    def param(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
        return {
            "name": name,
            "in": "header",
            "required": False,
            "description": description,
            "schema": schema,
        }

    return [
        param(REQUEST_TIMEOUT, "Seconds to wait for the result (else 504).", {"type": "number"}),
        param(
            "Prefer",
            "`respond-async`: answer 202 at once.",
            {"type": "string", "enum": ["respond-async"]},
        ),
        param(HEADER_LENGTH, "Binary bodies: length of their JSON part.", {"type": "integer"}),
    ]
