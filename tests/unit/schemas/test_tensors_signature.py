"""V2 tensors <-> numpy, and validation of request inputs against a model signature."""

from __future__ import annotations

import struct
from typing import Any, cast

import numpy as np
import pytest
from pydantic import ValidationError

from tidegate.core.errors import InvalidInputError
from tidegate.schemas.records import Datatype, TensorRecord
from tidegate.schemas.signature import Signature, TensorSpec, validate_inputs
from tidegate.schemas.tensors import (
    DATATYPES,
    datatype_of,
    decode_bytes_elements,
    encode_bytes_elements,
    from_numpy,
    to_numpy,
)

NUMERIC = [name for name in DATATYPES if name != "BYTES"]


def _sample(datatype: str) -> np.ndarray[Any, Any]:
    dtype = DATATYPES[datatype]
    if datatype == "BOOL":
        return np.array([[True, False, True], [False, False, True]])
    info = np.finfo(dtype) if dtype.kind == "f" else np.iinfo(dtype)
    values = [[info.min, 0, 1], [2, 3, info.max]]
    return np.array(values, dtype=dtype)


@pytest.mark.parametrize("datatype", NUMERIC)
def test_numeric_round_trip(datatype: str) -> None:
    array = _sample(datatype)
    record = from_numpy("x", array)
    assert record["datatype"] == datatype
    assert record["shape"] == [2, 3]
    assert len(record["data"]) == array.size * DATATYPES[datatype].itemsize
    back = to_numpy(record)
    assert back.dtype == DATATYPES[datatype]
    np.testing.assert_array_equal(back, array)


def test_numeric_data_is_little_endian_row_major() -> None:
    big_endian = np.array([[1.0, 2.0]], dtype=">f4")
    record = from_numpy("x", big_endian)
    assert record["datatype"] == "FP32"
    assert record["data"] == struct.pack("<2f", 1.0, 2.0)
    assert to_numpy(record).tolist() == [[1.0, 2.0]]


def test_bytes_round_trip_keeps_shape_and_content() -> None:
    items = np.empty((2, 2), dtype=object)
    items[:] = [[b"", b"a"], ["héllo".encode(), b"\x00\xff"]]
    record = from_numpy("text", items)
    assert record["datatype"] == "BYTES"
    assert record["shape"] == [2, 2]
    back = to_numpy(record)
    assert back.shape == (2, 2)
    assert back.tolist() == items.tolist()


def test_bytes_layout_is_length_prefixed_and_str_is_utf8() -> None:
    data = encode_bytes_elements(["hé", b"xy"])
    assert data == struct.pack("<I", 3) + "hé".encode() + struct.pack("<I", 2) + b"xy"
    assert decode_bytes_elements(data, 2, "t").tolist() == ["hé".encode(), b"xy"]
    assert datatype_of(np.array(["a", "b"])) == "BYTES"


def _record(datatype: Datatype, shape: list[int], data: bytes, name: str = "x") -> TensorRecord:
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


@pytest.mark.parametrize(
    ("record", "phrase"),
    [
        (_record("FP32", [2, 2], b"\x00" * 12), "needs 16 bytes, got 12"),
        (_record("INT64", [3], b"\x00" * 32), "needs 24 bytes, got 32"),
        (_record("FP32", [-1, 2], b""), "negative dimension"),
        # Not a V2 datatype: a damaged record, to check that it is refused.
        (_record(cast("Datatype", "COMPLEX"), [1], b"\x00" * 8), "unsupported datatype"),
        (_record("BYTES", [2], struct.pack("<I", 1) + b"a"), "fewer than 2 elements"),
        (_record("BYTES", [1], struct.pack("<I", 5) + b"ab"), "truncated element"),
        (_record("BYTES", [1], struct.pack("<I", 1) + b"ab"), "1 bytes too many"),
    ],
)
def test_data_that_does_not_fit_the_shape_is_refused(record: TensorRecord, phrase: str) -> None:
    with pytest.raises(InvalidInputError, match=phrase) as caught:
        to_numpy(record)
    assert caught.value.field == "x"


def test_a_dtype_without_v2_datatype_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="complex64"):
        from_numpy("x", np.zeros(2, dtype=np.complex64))


SIGNATURE = Signature(
    inputs=(
        TensorSpec(name="features", datatype="FP32", shape=(-1, 4)),
        TensorSpec(name="mask", datatype="BOOL", shape=(-1,)),
    ),
    outputs=(TensorSpec(name="score", datatype="FP32", shape=(-1, 1)),),
)


def _input(name: str, datatype: str, shape: list[int]) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape}


def test_valid_inputs_pass_with_any_batch_size() -> None:
    for rows in (1, 7):
        validate_inputs(
            SIGNATURE, [_input("features", "FP32", [rows, 4]), _input("mask", "BOOL", [rows])]
        )


@pytest.mark.parametrize(
    ("tensors", "field", "phrase"),
    [
        ([_input("other", "FP32", [1, 4])], "other", "unexpected input 'other'"),
        (
            [_input("features", "FP32", [1, 4]), _input("features", "FP32", [1, 4])],
            "features",
            "given twice",
        ),
        ([_input("features", "FP64", [1, 4])], "features", "must be FP32, got FP64"),
        ([_input("features", "FP32", [1, 5])], "features", r"must have shape \[-1, 4\]"),
        ([_input("features", "FP32", [4])], "features", "must have shape"),
        ([_input("features", "FP32", [1, 4])], "mask", "missing input 'mask'"),
    ],
)
def test_signature_errors_name_the_field(
    tensors: list[dict[str, Any]], field: str, phrase: str
) -> None:
    with pytest.raises(InvalidInputError, match=phrase) as caught:
        validate_inputs(SIGNATURE, tensors)
    assert caught.value.field == field


def test_a_spec_with_an_unknown_datatype_is_refused() -> None:
    with pytest.raises(ValidationError, match="unknown V2 datatype"):
        TensorSpec(name="x", datatype="FLOAT", shape=(-1,))
    with pytest.raises(ValidationError):
        Signature(inputs=(), outputs=(TensorSpec(name="y", datatype="FP32", shape=(-1,)),))
