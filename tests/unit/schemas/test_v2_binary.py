"""Triton's binary tensor extension, checked against tritonclient's own encoder and decoder."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.http._utils import _get_inference_request

from tidegate.core.errors import MalformedRequestError
from tidegate.gateway.v2api.responses import OutputPrefs, v2_response
from tidegate.schemas.records import ResultRecord
from tidegate.schemas.signature import Signature, TensorSpec
from tidegate.schemas.tensors import from_numpy, to_numpy
from tidegate.schemas.v2 import input_records, parse_request
from tidegate.schemas.v2_binary import HEADER_LENGTH, BinarySection, join_body, split_body

SIGNATURE = Signature(
    inputs=(
        TensorSpec(name="features", datatype="FP32", shape=(-1, 3)),
        TensorSpec(name="text", datatype="BYTES", shape=(-1,)),
    ),
    outputs=(TensorSpec(name="out", datatype="FP32", shape=(-1,)),),
)


def triton_request(binary: bool) -> tuple[bytes, int | None, np.ndarray, np.ndarray]:
    features = np.arange(6, dtype=np.float32).reshape(2, 3)
    text = np.array([b"hello", "wörld".encode()], dtype=object)
    a = httpclient.InferInput("features", list(features.shape), "FP32")
    a.set_data_from_numpy(features, binary_data=binary)
    b = httpclient.InferInput("text", list(text.shape), "BYTES")
    b.set_data_from_numpy(text, binary_data=binary)
    body, json_size = _get_inference_request(
        inputs=[a, b],
        request_id="",
        outputs=None,
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=0,
        timeout=None,
        custom_parameters=None,
    )
    return body, json_size, features, text


@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_requests_parse(binary: bool) -> None:
    body, json_size, features, text = triton_request(binary)
    assert (json_size is not None) == binary
    header, section = split_body(body, None if json_size is None else str(json_size))
    request = parse_request(header)
    got = {r["name"]: to_numpy(r) for r in input_records(request, section, SIGNATURE)}
    np.testing.assert_array_equal(got["features"], features)
    assert list(got["text"]) == list(text)
    # tritonclient asks for every output in binary when it names none.
    assert OutputPrefs.from_request(request).binary_default is True


@pytest.mark.parametrize("length", ["abc", "-1", "999999"])
def test_bad_header_length_is_malformed(length: str) -> None:
    with pytest.raises(MalformedRequestError) as exc:
        split_body(b"{}", length)
    assert exc.value.field == HEADER_LENGTH


def test_binary_section_is_taken_in_order() -> None:
    section = BinarySection(b"abcdef")
    assert section.take(2, "x") == b"ab"
    assert section.take(4, "y") == b"cdef"
    section.check_consumed()
    with pytest.raises(MalformedRequestError) as exc:
        section.take(1, "z")
    assert exc.value.field == "z"
    with pytest.raises(MalformedRequestError):
        BinarySection(b"").take(-1, "n")


def test_binary_response_reads_back_with_tritonclient() -> None:
    probs = np.array([[0.1, 0.9], [0.7, 0.3]], dtype=np.float32)
    words = np.array([b"a", b"\xffraw"], dtype=object)
    result: ResultRecord = {
        "request_id": "r7",
        "model": "m",
        "model_version": "3",
        "status": "OK",
        "outputs": [from_numpy("probabilities", probs), from_numpy("words", words)],
        "completed_at": 0,
    }
    header, parts = v2_response(result, OutputPrefs(binary_default=True))
    content, header_length = join_body(header, parts)
    assert header_length == len(json.dumps(header, separators=(",", ":")))
    parsed = httpclient.InferResult.from_response_body(content, header_length=header_length)
    np.testing.assert_array_equal(parsed.as_numpy("probabilities"), probs)
    assert list(parsed.as_numpy("words")) == list(words)
    assert parsed.get_response()["model_version"] == "3"


def test_json_only_response_has_no_header_length() -> None:
    content, header_length = join_body({"outputs": []}, [])
    assert header_length is None
    assert json.loads(content) == {"outputs": []}
