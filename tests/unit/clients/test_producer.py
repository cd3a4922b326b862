"""The producer client's records and the `tidegate produce` line format, without servers."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta

import fastavro
import numpy as np
import pytest

from tidegate.clients.jsonl import parse_line
from tidegate.clients.producer import TidegateProducer, build_request, request_key
from tidegate.core.errors import ConfigurationError, InvalidInputError
from tidegate.schemas.catalog import INFERENCE_REQUEST, load_schema
from tidegate.schemas.records import RequestRecord
from tidegate.schemas.tensors import from_numpy, to_numpy

REQUEST_SCHEMA = load_schema(INFERENCE_REQUEST).parsed


def encodes(record: RequestRecord) -> None:
    fastavro.schemaless_writer(io.BytesIO(), REQUEST_SCHEMA, record)


def test_build_request_from_named_arrays() -> None:
    features = np.ones((1, 64), dtype=np.float32)
    record = build_request("fraud", {"features": features}, routing_key="card-1", tenant="acme")
    encodes(record)
    assert record["model"] == "fraud"
    assert record["model_version"] is None
    assert record["tenant"] == "acme"
    assert record["reply_to"] is None
    (tensor,) = record["inputs"]
    np.testing.assert_array_equal(to_numpy(tensor), features)
    assert len(record["request_id"]) == 32
    assert request_key(record) == b"card-1"


def test_build_request_from_tensor_records_and_relative_deadline() -> None:
    tensor = from_numpy("text", np.array([b"hi"], dtype=object))
    record = build_request(
        "minilm",
        [tensor],
        version="1",
        deadline=timedelta(seconds=5),
        request_id="r-1",
        outputs=["embedding"],
        parameters={"priority": 1},
        reply_to={"topic": "replies", "partition": 2},
    )
    encodes(record)
    assert record["inputs"] == [tensor]
    assert record["model_version"] == "1"
    deadline, created_at = record["deadline"], record["created_at"]
    assert isinstance(deadline, datetime)
    assert isinstance(created_at, datetime)
    assert (deadline - created_at) == timedelta(seconds=5)
    assert request_key(record) == b"r-1", "no routing key: keyed by request id"


def test_absolute_deadline_is_kept() -> None:
    when = datetime(2030, 1, 1, tzinfo=UTC)
    assert build_request("m", {"x": np.zeros(1)}, deadline=when)["deadline"] == when


def test_unstarted_producer_refuses() -> None:
    producer = TidegateProducer()
    with pytest.raises(ConfigurationError):
        producer.publish("fraud", {"features": np.zeros((1, 64), dtype=np.float32)})
    with pytest.raises(ConfigurationError):
        producer.await_result("r", timeout=0.01)


def test_keyless_requests_stay_on_one_partition_for_a_whole_linger() -> None:
    """A partition switched within a linger splits that linger's requests over two
    ProduceRequests: the sticky window is the linger, or librdkafka's 10 ms when shorter."""
    assert TidegateProducer(producer_extra={"linger.ms": 20}).sticky_window_s == 0.02
    assert TidegateProducer(producer_extra={"linger.ms": 2}).sticky_window_s == 0.01
    assert TidegateProducer().sticky_window_s == 0.01


def test_parse_line() -> None:
    line = {
        "model": "fraud",
        "version": "2",
        "routing_key": "card-9",
        "id": "x-1",
        "inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 2], "data": [[1, 2]]}],
        "parameters": {"priority": 3},
    }
    kwargs = parse_line(json.dumps(line), default_tenant="acme")
    assert kwargs["model"] == "fraud"
    assert kwargs["version"] == "2"
    assert kwargs["request_id"] == "x-1"
    assert kwargs["tenant"] == "acme"
    assert kwargs["parameters"] == {"priority": 3}
    np.testing.assert_array_equal(to_numpy(kwargs["inputs"][0]), [[1, 2]])
    encodes(build_request(**kwargs))


X = {"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("not json", None),
        ('{"inputs": []}', "model"),
        ('{"model": "m", "inputs": []}', "inputs"),
        (json.dumps({"model": "m", "inputs": [X | {"shape": [2]}]}), "x"),
        (json.dumps({"model": "m", "color": 1, "inputs": [X]}), "color"),
    ],
)
def test_bad_lines_say_why(text: str, field: str | None) -> None:
    with pytest.raises(InvalidInputError) as exc:
        parse_line(text)
    assert exc.value.field == field
