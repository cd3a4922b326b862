"""The Avro codec: round trips, schema evolution and typed wire errors (no servers)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry._sync.mock_schema_registry_client import (
    MockSchemaRegistryClient,
)
from confluent_kafka.serialization import MessageField, SerializationContext

from tests.support import unique
from tests.unit.schemas.codec_samples import SAMPLES
from tidegate.core.errors import (
    SchemaMismatchError,
    SchemaNotFoundError,
    SerializationError,
    SubjectNotFoundError,
    UnknownSchemaError,
    WireFormatError,
)
from tidegate.schemas.catalog import (
    INFERENCE_REQUEST,
    INFERENCE_RESULT,
    MODEL_LIFECYCLE_EVENT,
    SCHEMA_DIR,
    ProjectSchema,
    load_schema,
)
from tidegate.schemas.codec import AvroDecoder, AvroEncoder
from tidegate.schemas.wire import pack, unpack


@pytest.fixture
def client() -> SchemaRegistryClient:
    # The mock client is enough to exercise framing and id resolution; the real registry is
    # exercised by the integration tests.
    return MockSchemaRegistryClient({"url": f"mock://{unique('unit')}"})


def ctx(topic: str) -> SerializationContext:
    return SerializationContext(topic, MessageField.VALUE)


@pytest.mark.parametrize("fullname", sorted(SAMPLES))
def test_round_trip_every_schema(client: SchemaRegistryClient, fullname: str) -> None:
    schema = load_schema(fullname)
    encoder = AvroEncoder(client, schema, auto_register=True)
    decoder = AvroDecoder(client, schema)
    data = encoder(SAMPLES[fullname], ctx("t"))
    assert data[0] == 0
    schema_id, _ = unpack(data)
    assert client.get_latest_version("t-value").schema_id == schema_id
    decoded = decoder(data, ctx("t"))
    expected = SAMPLES[fullname]
    if fullname == MODEL_LIFECYCLE_EVENT:
        # fastavro reads a union of records back as a plain dict; the tuple only picks the branch.
        expected = {**expected, "payload": expected["payload"][1]}
    assert decoded == expected


def test_schemas_are_self_contained_and_namespaced() -> None:
    for fullname in SAMPLES:
        schema = load_schema(fullname)
        parsed = json.loads(schema.text)
        assert parsed["name"] == fullname
        assert fullname.startswith("dev.tidegate.")
        # shared types are inlined, so a registry needs no schema references
        assert "dev.tidegate.common" not in json.dumps(parsed) or '"fields"' in schema.text


def _evolved(tmp_path: Path, fullname: str, mutate: Any) -> ProjectSchema:
    for path in SCHEMA_DIR.glob("*.avsc"):
        (tmp_path / path.name).write_text(path.read_text())
    target = tmp_path / f"{fullname}.avsc"
    doc = json.loads(target.read_text())
    mutate(doc)
    target.write_text(json.dumps(doc))
    load_schema.cache_clear()
    try:
        return load_schema(fullname, tmp_path)
    finally:
        load_schema.cache_clear()


def test_old_writer_is_read_by_new_reader(client: SchemaRegistryClient, tmp_path: Path) -> None:
    """Data written before a field existed is read with that field's default."""
    current = load_schema(INFERENCE_REQUEST)

    def drop_tenant(doc: dict[str, Any]) -> None:
        doc["fields"] = [f for f in doc["fields"] if f["name"] != "tenant"]

    old = _evolved(tmp_path, INFERENCE_REQUEST, drop_tenant)
    old_record = copy.deepcopy(SAMPLES[INFERENCE_REQUEST])
    del old_record["tenant"]
    data = AvroEncoder(client, old, auto_register=True)(old_record, ctx("evo"))
    decoded = AvroDecoder(client, current)(data, ctx("evo"))
    assert decoded["tenant"] == "default"
    assert decoded["request_id"] == "r-1"


def test_new_writer_is_read_by_old_reader(client: SchemaRegistryClient, tmp_path: Path) -> None:
    """A field added with a default is ignored by readers that predate it (forward compatible)."""

    def add_priority(doc: dict[str, Any]) -> None:
        doc["fields"].append({"name": "priority", "type": "int", "default": 0})

    new = _evolved(tmp_path, INFERENCE_REQUEST, add_priority)
    record = {**SAMPLES[INFERENCE_REQUEST], "priority": 5}
    data = AvroEncoder(client, new, auto_register=True)(record, ctx("fwd"))
    decoded = AvroDecoder(client, load_schema(INFERENCE_REQUEST))(data, ctx("fwd"))
    assert "priority" not in decoded
    assert decoded["model"] == "fraud"


def test_bad_magic_byte_is_a_wire_format_error(client: SchemaRegistryClient) -> None:
    with pytest.raises(WireFormatError, match="magic byte 7"):
        AvroDecoder(client)(b"\x07\x00\x00\x00\x01abc")


def test_short_message_is_a_wire_format_error(client: SchemaRegistryClient) -> None:
    with pytest.raises(WireFormatError, match="shorter"):
        AvroDecoder(client)(b"\x00\x00")
    with pytest.raises(WireFormatError, match="null"):
        AvroDecoder(client)(None)


def test_unknown_schema_id_is_told_apart(client: SchemaRegistryClient) -> None:
    with pytest.raises(UnknownSchemaError) as caught:
        AvroDecoder(client)(pack(424242, b"\x02"))
    assert caught.value.schema_id == 424242
    assert not isinstance(caught.value, WireFormatError)


def test_body_that_does_not_match_schema(client: SchemaRegistryClient) -> None:
    schema = load_schema(INFERENCE_REQUEST)
    schema_id = client.register_schema("m-value", Schema(schema.text, "AVRO"))
    with pytest.raises(SchemaMismatchError):
        AvroDecoder(client, schema)(pack(schema_id, b"\x99\x99\x99"))
    good = AvroEncoder(client, schema, auto_register=True)(SAMPLES[INFERENCE_REQUEST], ctx("m"))
    with pytest.raises(SchemaMismatchError, match="left over"):
        AvroDecoder(client, schema)(good + b"trailing")


def test_invalid_record_names_the_field(client: SchemaRegistryClient) -> None:
    record = {**SAMPLES[INFERENCE_REQUEST], "model": 42}
    encoder = AvroEncoder(client, load_schema(INFERENCE_REQUEST), auto_register=True)
    with pytest.raises(SchemaMismatchError, match="model") as caught:
        encoder(record, ctx("bad"))
    assert isinstance(caught.value, SerializationError)
    assert not caught.value.retriable


def test_encoder_without_auto_register_needs_the_subject(client: SchemaRegistryClient) -> None:
    encoder = AvroEncoder(client, load_schema(INFERENCE_REQUEST))
    with pytest.raises((SchemaNotFoundError, SubjectNotFoundError)):
        encoder(SAMPLES[INFERENCE_REQUEST], ctx("never-registered"))


def test_a_writer_of_another_type_is_named_not_quoted(client: SchemaRegistryClient) -> None:
    """fastavro's resolution error quotes both schemas whole (about 20 KB): every poison pill's
    log line and dead-letter envelope repeated them."""
    schema_id = client.register_schema("other-value", Schema(load_schema(INFERENCE_RESULT).text))
    with pytest.raises(SchemaMismatchError) as caught:
        AvroDecoder(client, load_schema(INFERENCE_REQUEST))(pack(schema_id, b"\x00" * 40))
    message = str(caught.value)
    assert message == (
        f"writer schema {schema_id} (dev.tidegate.inference.InferenceResult) cannot be read as "
        "dev.tidegate.inference.InferenceRequest"
    )
