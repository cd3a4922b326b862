"""V2 JSON requests into Tensor records, V2 responses out of results, field names in errors."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import pytest

from tidegate.core.errors import InvalidInputError, MalformedRequestError
from tidegate.gateway.v2api.responses import OutputPrefs, v2_response
from tidegate.schemas.records import ResultRecord, TensorRecord
from tidegate.schemas.signature import Signature, TensorSpec
from tidegate.schemas.tensors import from_numpy, to_numpy
from tidegate.schemas.v2 import input_records, parse_request, scalar_parameters
from tidegate.schemas.v2_binary import BinarySection

FRAUD = Signature(
    inputs=(TensorSpec(name="features", datatype="FP32", shape=(-1, 4)),),
    outputs=(TensorSpec(name="probabilities", datatype="FP32", shape=(-1, 2)),),
)
TEXT = Signature(
    inputs=(TensorSpec(name="text", datatype="BYTES", shape=(-1,)),),
    outputs=(TensorSpec(name="embedding", datatype="FP32", shape=(-1, 3)),),
)
COUNTS = Signature(
    inputs=(TensorSpec(name="n", datatype="UINT8", shape=(-1,)),),
    outputs=(TensorSpec(name="out", datatype="BOOL", shape=(-1,)),),
)


def records(body: dict[str, Any], signature: Signature, binary: bytes = b"") -> list[TensorRecord]:
    import json

    return input_records(parse_request(json.dumps(body).encode()), BinarySection(binary), signature)


def fraud(data: Any, shape: list[int] | None = None, **extra: Any) -> dict[str, Any]:
    tensor = {"name": "features", "datatype": "FP32", "shape": shape or [2, 4], "data": data}
    return {"inputs": [tensor], **extra}


def field_of(exc: pytest.ExceptionInfo[InvalidInputError]) -> str | None:
    return exc.value.field


def test_flat_and_nested_data_give_the_same_record() -> None:
    flat = records(fraud([1, 2, 3, 4, 5, 6, 7, 8]), FRAUD)
    nested = records(fraud([[1, 2, 3, 4], [5, 6, 7, 8]]), FRAUD)
    assert flat == nested
    (tensor,) = flat
    assert tensor["datatype"] == "FP32"
    assert tensor["shape"] == [2, 4]
    np.testing.assert_array_equal(to_numpy(tensor), np.arange(1, 9, dtype="<f4").reshape(2, 4))


def test_bytes_as_strings() -> None:
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["hé", "yo"]}]}
    (tensor,) = records(body, TEXT)
    assert tensor["data"] == struct.pack("<I", 3) + "hé".encode() + struct.pack("<I", 2) + b"yo"


def test_binary_input_taken_from_the_binary_section() -> None:
    raw = np.arange(8, dtype="<f4").tobytes()
    body = fraud(None, parameters={})
    body["inputs"][0]["parameters"] = {"binary_data_size": len(raw)}
    del body["inputs"][0]["data"]
    (tensor,) = records(body, FRAUD, raw)
    assert tensor["data"] == raw
    assert tensor["parameters"] == {}, "binary_data_size is transport-only, not forwarded"


def test_binary_size_that_does_not_fit_the_shape_is_refused() -> None:
    body = fraud(None)
    body["inputs"][0]["parameters"] = {"binary_data_size": 12}
    del body["inputs"][0]["data"]
    with pytest.raises(InvalidInputError) as exc:
        records(body, FRAUD, b"\0" * 12)
    assert field_of(exc) == "features"


def test_binary_bytes_left_over_are_refused() -> None:
    body = fraud(list(range(8)))
    with pytest.raises(MalformedRequestError, match="no tensor claims"):
        records(body, FRAUD, b"extra")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (fraud([1, 2, 3]), "features"),  # too few elements for the shape
        (fraud([[1, 2, 3, 4], [5, 6, 7]]), "features"),  # ragged
        (fraud(["a"] * 8), "features"),  # not numbers
        (fraud(list(range(8)), shape=[2, 5]), "features"),  # shape not in the signature
        (fraud(list(range(8)), shape=[-2, -4]), "features"),  # negative dimensions
        (fraud(None), "features"),  # no data at all
        (
            {
                "inputs": [
                    {"name": "features", "datatype": "FP64", "shape": [2, 4], "data": [0] * 8}
                ]
            },
            "features",
        ),
        ({"inputs": [{"name": "other", "datatype": "FP32", "shape": [1], "data": [0]}]}, "other"),
        ({"inputs": []}, "inputs"),
        ({"inputs": [{"name": "features", "shape": [1, 4], "data": [0] * 4}]}, "inputs.0.datatype"),
        (fraud(list(range(8)), outputs=[{"name": "logits"}]), "outputs.0.name"),
        (fraud(list(range(8)), surprise=1), "surprise"),
    ],
)
def test_invalid_requests_name_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInputError) as exc:
        records(body, FRAUD)
    assert field_of(exc) == field, exc.value


def test_integers_must_fit_their_datatype() -> None:
    ok = {"inputs": [{"name": "n", "datatype": "UINT8", "shape": [2], "data": [0, 255]}]}
    assert records(ok, COUNTS)[0]["data"] == b"\x00\xff"
    for bad in ([0, 256], [-1, 0], [0.5, 1]):
        body = {"inputs": [{"name": "n", "datatype": "UINT8", "shape": [2], "data": bad}]}
        with pytest.raises(InvalidInputError) as exc:
            records(body, COUNTS)
        assert field_of(exc) == "n"


def test_bytes_data_must_be_strings() -> None:
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [3]}]}
    with pytest.raises(InvalidInputError) as exc:
        records(body, TEXT)
    assert field_of(exc) == "text"


def test_malformed_json_is_its_own_error() -> None:
    with pytest.raises(MalformedRequestError):
        parse_request(b'{"inputs": [')


def test_parameters_forwarded_must_be_scalars() -> None:
    assert scalar_parameters({"a": 1, "b": None, "binary_data_output": True}, "parameters") == {
        "a": 1,
        "b": None,
    }
    with pytest.raises(InvalidInputError) as exc:
        scalar_parameters({"nested": {"x": 1}}, "parameters")
    assert field_of(exc) == "parameters.nested"


def result(*outputs: TensorRecord) -> ResultRecord:
    return {
        "request_id": "r1",
        "model": "fraud",
        "model_version": "2",
        "status": "OK",
        "outputs": list(outputs),
        "completed_at": 0,
    }


def test_response_json_outputs_are_flat_lists() -> None:
    probs = from_numpy("probabilities", np.array([[0.25, 0.75]], dtype="<f4"))
    text = from_numpy("echo", np.array([b"ok", "hé".encode()], dtype=object))
    body, parts = v2_response(result(probs, text), OutputPrefs())
    assert parts == []
    assert (body["model_name"], body["model_version"], body["id"]) == ("fraud", "2", "r1")
    assert body["outputs"] == [
        {"name": "probabilities", "datatype": "FP32", "shape": [1, 2], "data": [0.25, 0.75]},
        {"name": "echo", "datatype": "BYTES", "shape": [2], "data": ["ok", "hé"]},
    ]


def test_response_binary_outputs_on_request() -> None:
    probs = from_numpy("probabilities", np.array([[0.25, 0.75]], dtype="<f4"))
    per_output = OutputPrefs(binary={"probabilities": True})
    request_level = OutputPrefs(binary_default=True)
    for prefs in (per_output, request_level):
        body, parts = v2_response(result(probs), prefs)
        (entry,) = body["outputs"]
        assert "data" not in entry
        assert entry["parameters"] == {"binary_data_size": 8}
        assert parts == [probs["data"]]


def test_response_keeps_only_requested_outputs() -> None:
    a = from_numpy("a", np.zeros(1, dtype="<f4"))
    b = from_numpy("b", np.ones(1, dtype="<f4"))
    body, _ = v2_response(result(a, b), OutputPrefs(names=("b",)))
    assert [o["name"] for o in body["outputs"]] == ["b"]


def test_what_json_cannot_carry_goes_binary() -> None:
    raw = from_numpy("blob", np.array([b"\xff\xfe"], dtype=object))
    nan = from_numpy("x", np.array([np.nan], dtype="<f4"))
    body, parts = v2_response(result(raw, nan), OutputPrefs())
    assert [o["parameters"]["binary_data_size"] for o in body["outputs"]] == [6, 4]
    assert parts == [raw["data"], nan["data"]]


def test_prefs_round_trip_through_meta() -> None:
    prefs = OutputPrefs(names=("a",), binary={"a": True}, binary_default=True)
    assert OutputPrefs.from_meta(prefs.to_meta()) == prefs
    assert OutputPrefs.from_meta(None) == OutputPrefs()


def test_an_output_asked_for_again_is_kept_once() -> None:
    outputs = [
        {"name": "probabilities", "parameters": {"binary_data": True}},
        {"name": "probabilities"},
        {"name": "logits"},
        {"name": "probabilities", "parameters": {"binary_data": False}},
    ]
    request = parse_request(json.dumps(fraud([0] * 8, outputs=outputs)).encode())
    assert request.outputs is not None
    assert [(o.name, o.parameters) for o in request.outputs] == [
        ("probabilities", {"binary_data": True}),
        ("logits", {}),
    ]
