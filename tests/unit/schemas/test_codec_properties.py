"""The Avro codec over every record its schemas allow (property tests): each project schema's
records round-trip unchanged, and every truncation of an encoded frame is refused with a
`SerializationError` (a bad frame or a body that does not match), never another exception and
never a shorter record."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry._sync.mock_schema_registry_client import (
    MockSchemaRegistryClient,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from tidegate.core.errors import SerializationError
from tidegate.schemas.catalog import (
    AUDIT_EVENT,
    BREAKER_STATE,
    DEAD_LETTER_ENVELOPE,
    INFERENCE_REQUEST,
    INFERENCE_RESULT,
    MODEL_LIFECYCLE_EVENT,
    SHADOW_COMPARISON,
    load_schema,
)
from tidegate.schemas.codec import AvroDecoder, AvroEncoder

SCHEMAS = [
    INFERENCE_REQUEST,
    INFERENCE_RESULT,
    DEAD_LETTER_ENVELOPE,
    MODEL_LIFECYCLE_EVENT,
    SHADOW_COMPARISON,
    AUDIT_EVENT,
    BREAKER_STATE,
]
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
PRIMITIVES: dict[str, st.SearchStrategy[Any]] = {
    "null": st.none(),
    "boolean": st.booleans(),
    "int": st.integers(-(2**31), 2**31 - 1),
    "long": st.integers(-(2**63), 2**63 - 1),
    "float": st.floats(width=32, allow_nan=False),
    "double": st.floats(allow_nan=False),
    "bytes": st.binary(max_size=24),
    "string": st.text(max_size=12),
}


class Values:
    """A strategy of the values a parsed (fastavro) schema allows, in the notation the encoder
    takes and the decoder gives back with `return_record_name`: a record in a union is
    `(full name, dict)`, so a value is always written with the branch it came from."""

    def __init__(self) -> None:
        self.named: dict[str, Any] = {}

    def of(self, schema: Any, depth: int = 0) -> st.SearchStrategy[Any]:
        if isinstance(schema, str):
            if schema in PRIMITIVES:
                return PRIMITIVES[schema]
            return self.of(self.named[schema], depth)
        if isinstance(schema, list):
            return st.one_of(*(self._branch(b, depth) for b in schema))
        kind = schema["type"]
        if schema.get("logicalType") == "timestamp-millis":
            # Milliseconds since the epoch, as the reader gives them back: UTC datetimes.
            millis = st.integers(-(10**12), 10**13)
            return millis.map(lambda ms: EPOCH + timedelta(milliseconds=ms))
        if kind in ("record", "error"):
            self.named[schema["name"]] = schema
            fields = {f["name"]: self.of(f["type"], depth + 1) for f in schema["fields"]}
            return st.fixed_dictionaries(fields)
        if kind == "enum":
            self.named[schema["name"]] = schema
            return st.sampled_from(schema["symbols"])
        if kind == "fixed":
            self.named[schema["name"]] = schema
            return st.binary(min_size=schema["size"], max_size=schema["size"])
        # Collections stay small, and empty below the top levels: frames stay short.
        size = 3 if depth < 3 else 0
        if kind == "array":
            return st.lists(self.of(schema["items"], depth + 1), max_size=size)
        if kind == "map":
            return st.dictionaries(
                st.text(max_size=6), self.of(schema["values"], depth + 1), max_size=size
            )
        return self.of(kind, depth)

    def _is_record(self, branch: Any) -> bool:
        resolved = self.named.get(branch, branch) if isinstance(branch, str) else branch
        return isinstance(resolved, dict) and resolved.get("type") in ("record", "error")

    def _branch(self, branch: Any, depth: int) -> st.SearchStrategy[Any]:
        values = self.of(branch, depth)
        if not self._is_record(branch):
            return values
        name = branch if isinstance(branch, str) else branch["name"]
        return values.map(lambda value: (name, value))


def codec(name: str) -> tuple[AvroEncoder, AvroDecoder, int]:
    schema = load_schema(name)
    client = MockSchemaRegistryClient({"url": "mock://codec-properties"})
    schema_id = client.register_schema(f"{name}-value", Schema(schema.text, "AVRO"))
    decoder = AvroDecoder(client, schema, return_record_name=True)
    return AvroEncoder(client, schema), decoder, schema_id


CODECS = {name: codec(name) for name in SCHEMAS}
RECORDS = {name: Values().of(load_schema(name).parsed) for name in SCHEMAS}


@pytest.mark.parametrize("name", SCHEMAS)
@settings(max_examples=40)
@given(data=st.data())
def test_every_valid_record_round_trips(name: str, data: st.DataObject) -> None:
    encoder, decoder, schema_id = CODECS[name]
    record = data.draw(RECORDS[name], label=name)
    assert decoder(encoder.encode(record, schema_id)) == record


@pytest.mark.parametrize("name", SCHEMAS)
@settings(max_examples=20)
@given(data=st.data())
def test_every_truncation_is_refused_cleanly(name: str, data: st.DataObject) -> None:
    encoder, decoder, schema_id = CODECS[name]
    frame = encoder.encode(data.draw(RECORDS[name], label=name), schema_id)
    for cut in range(len(frame)):
        with pytest.raises(SerializationError):
            decoder(frame[:cut])
