"""The V2 binary extension's parser over any body (property tests): splitting the body, parsing
its JSON header and taking each tensor's bytes either gives records whose bytes are exactly the
binary section, in order, none left over and none beyond it, or refuses with an
`InvalidInputError`; never another exception, whatever the header claims."""

from __future__ import annotations

import contextlib
import json
import struct
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from tidegate.core.errors import InvalidInputError, MalformedRequestError
from tidegate.schemas.records import TensorRecord
from tidegate.schemas.signature import Signature, TensorSpec
from tidegate.schemas.tensors import DATATYPES
from tidegate.schemas.v2 import input_records, parse_request
from tidegate.schemas.v2_binary import BinarySection, split_body

SIGNATURE = Signature(
    inputs=(
        TensorSpec(name="features", datatype="FP32", shape=(-1, 3)),
        TensorSpec(name="text", datatype="BYTES", shape=(-1,)),
    ),
    outputs=(TensorSpec(name="out", datatype="FP32", shape=(-1,)),),
)
ODD = st.one_of(
    st.none(), st.booleans(), st.floats(), st.text(max_size=4), st.lists(st.integers(), max_size=2)
)


def parsed(body: bytes, header_length: str | None) -> tuple[list[TensorRecord], bytes]:
    """What the gateway does with a body: the input records, and the binary section."""
    header, binary = split_body(body, header_length)
    records = input_records(parse_request(header), binary, SIGNATURE)
    return records, body[len(header) :]


@st.composite
def tensors(draw: st.DrawFn) -> dict[str, Any]:
    """An input as a client may send it: mostly well formed, sometimes not at all."""
    name = draw(st.sampled_from(["features", "text", "other"]))
    datatype = draw(st.sampled_from([*DATATYPES, "FP8"]))
    shape = draw(st.lists(st.integers(-1, 4), max_size=3))
    tensor: dict[str, Any] = {"name": name, "datatype": datatype, "shape": shape}
    size = draw(st.one_of(st.integers(-2, 64), ODD))
    if draw(st.booleans()):
        tensor["parameters"] = {"binary_data_size": size}
    if draw(st.booleans()):
        tensor["data"] = draw(st.lists(st.one_of(st.integers(), st.text(max_size=3)), max_size=6))
    return tensor


@st.composite
def signed_requests(draw: st.DrawFn) -> tuple[list[dict[str, Any]], bytes]:
    """Inputs of the signature with their bytes in the binary section, as a client encodes
    them, and sometimes a size off by one byte."""
    rows = draw(st.integers(0, 3))
    features = draw(st.binary(min_size=rows * 12, max_size=rows * 12))  # any 4 bytes are an FP32
    texts = draw(st.lists(st.binary(max_size=5), max_size=3))
    text = b"".join(struct.pack("<I", len(t)) + t for t in texts)
    tensors = [
        ("features", "FP32", [rows, 3], features),
        ("text", "BYTES", [len(texts)], text),
    ]
    inputs, parts = [], []
    for name, datatype, shape, data in draw(st.permutations(tensors)):
        size = len(data) + draw(st.sampled_from([0, 0, 0, 0, -1, 1]))
        inputs.append(
            {"name": name, "datatype": datatype, "shape": shape,
             "parameters": {"binary_data_size": size}}
        )  # fmt: skip
        parts.append(data)
    return inputs, b"".join(parts)


@st.composite
def bodies(draw: st.DrawFn) -> tuple[bytes, str | None]:
    """A JSON header, binary bytes after it, and an `Inference-Header-Content-Length` that is
    right, a little off, or not a number."""
    if draw(st.booleans()):
        inputs, binary = draw(signed_requests())
    else:
        inputs, binary = draw(st.lists(tensors(), max_size=3)), draw(st.binary(max_size=80))
    header = json.dumps({"inputs": inputs}).encode()
    body = header + binary
    length = draw(
        st.one_of(
            st.just(str(len(header))),
            st.integers(-3, len(body) + 3).map(str),
            st.none(),
            st.text(max_size=4),
        )
    )
    return body, length


def binary_records(records: list[TensorRecord], request: dict[str, Any]) -> list[bytes]:
    return [
        r["data"]
        for r, t in zip(records, request["inputs"], strict=True)
        if "binary_data_size" in t.get("parameters", {})
    ]


@settings(max_examples=300)
@given(bodies())
def test_a_body_gives_records_of_exactly_its_binary_section_or_an_invalid_input(
    call: tuple[bytes, str | None],
) -> None:
    body, length = call
    try:
        records, section = parsed(body, length)
    except InvalidInputError as refused:
        event(f"refused: {refused.code}")
        return
    event("accepted")
    request = json.loads(body[: len(body) - len(section)] or b"{}")
    # Every byte of the section went to exactly one tensor, in order: none left, none beyond.
    assert b"".join(binary_records(records, request)) == section


@settings(max_examples=200)
@given(st.binary(max_size=120), st.one_of(st.none(), st.integers(-2, 130).map(str), st.text()))
def test_any_bytes_at_all_are_records_or_an_invalid_input(body: bytes, length: str | None) -> None:
    with contextlib.suppress(InvalidInputError):
        parsed(body, length)


@given(st.binary(max_size=64), st.lists(st.one_of(st.integers(-2, 70), ODD), max_size=6))
def test_a_take_is_exactly_the_bytes_asked_for_or_refused(data: bytes, sizes: list[Any]) -> None:
    section = BinarySection(data)
    position = 0
    for size in sizes:
        fits = isinstance(size, int) and not isinstance(size, bool) and size >= 0
        if fits and position + size <= len(data):
            assert section.take(size, "size") == data[position : position + size]
            position += size
        else:
            with pytest.raises(MalformedRequestError):
                section.take(size, "size")
    if position == len(data):
        section.check_consumed()
    else:
        with pytest.raises(MalformedRequestError):
            section.check_consumed()
