"""Prediction cache keys: the same question gives the same key, anything that may change the
answer gives another; values round-trip, and damaged ones are refused."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from tidegate.schemas.prediction_keys import decode_outputs, encode_outputs, prediction_key
from tidegate.schemas.records import Datatype, ParameterValue, TensorRecord


def tensor(
    name: str = "x",
    values: tuple[float, ...] = (1.0, 2.0),
    *,
    datatype: Datatype = "FP32",
    shape: list[int] | None = None,
    parameters: dict[str, ParameterValue] | None = None,
) -> TensorRecord:
    return {
        "name": name,
        "datatype": datatype,
        "shape": [1, len(values)] if shape is None else shape,
        "data": struct.pack(f"<{len(values)}f", *values),
        "parameters": {} if parameters is None else parameters,
    }


def key(
    inputs: list[TensorRecord] | None = None,
    *,
    version: str = "1",
    outputs: tuple[str, ...] = (),
    parameters: dict[str, Any] | None = None,
    tenant: str = "default",
) -> str:
    return prediction_key(
        "p:", "fraud", version, inputs or [tensor()], outputs, parameters, tenant=tenant
    )


def test_the_key_names_model_and_version_and_is_stable() -> None:
    first = key()
    assert first == key()
    assert first.startswith("p:fraud:1:")
    assert len(first.rsplit(":", 1)[1]) == 32


def test_the_version_is_part_of_the_key() -> None:
    assert key(version="1") != key(version="2")


def test_inputs_are_keyed_in_name_order_whatever_order_they_came_in() -> None:
    a, b = tensor("a"), tensor("b", (3.0,))
    assert key([a, b]) == key([b, a])


def test_tensor_parameters_do_not_change_the_key() -> None:
    assert key([tensor(parameters={"binary_data_size": 8})]) == key()


@pytest.mark.parametrize(
    "other",
    [
        [tensor(values=(1.0, 2.5))],  # data
        [tensor(shape=[2, 1])],  # shape, same bytes
        [tensor(datatype="INT32")],  # datatype, same bytes
        [tensor("y")],  # name
        [tensor(), tensor("y")],  # one more input
    ],
)
def test_anything_about_the_inputs_changes_the_key(other: list[TensorRecord]) -> None:
    assert key(other) != key()


def test_requested_outputs_and_their_order_change_the_key() -> None:
    assert key(outputs=("a",)) != key()
    assert key(outputs=("a", "b")) != key(outputs=("b", "a"))


def test_parameters_change_the_key_but_transport_ones_do_not() -> None:
    assert key(parameters={"temperature": 0.5}) != key()
    assert key(parameters={"temperature": 1}) != key(parameters={"temperature": 1.0})
    assert key(parameters={"timeout": 5000, "priority": 1, "binary_data_output": True}) == key()


def test_length_prefixes_keep_concatenations_apart() -> None:
    assert key([tensor("ab", (1.0,))], version="1") != prediction_key(
        "p:", "fraud", "1a", [tensor("b", (1.0,))], tenant="default"
    )


def test_outputs_round_trip() -> None:
    outputs = [tensor("probabilities", (0.25, 0.75)), tensor("label", (1.0,), datatype="INT32")]
    decoded = decode_outputs(encode_outputs(outputs))
    assert decoded == outputs


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"nope",
        b"TGPC1\x05\x00\x00\x00[1,2",
        encode_outputs([tensor()])[:-1],
        encode_outputs([tensor()]) + b"x",
        b"TGPC1\x03\x00\x00\x00[1]",
    ],
)
def test_a_damaged_value_is_refused(value: bytes) -> None:
    with pytest.raises(ValueError, match="prediction cache"):
        decode_outputs(value)


def test_each_tenant_has_its_own_entries() -> None:
    """A hit (`cached: true`) must not tell one tenant what another asked."""
    assert key(tenant="acme") != key(tenant="globex")
    assert key(tenant="acme") == key(tenant="acme")
