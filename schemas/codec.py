"""Avro encoding and decoding in the Confluent wire format, with fastavro.

`AvroEncoder` and `AvroDecoder` follow confluent-kafka's serializer contract, `__call__(obj, ctx)`,
so they plug into its `SerializingProducer`/`DeserializingConsumer` as well as into our own loops.
They add what the hot path and dead-letter routing need:

* writer schemas are fetched by id once and cached, parsed; records are read with the reader schema
  the decoder was built for, so an old writer is read by a new reader;
* every failure is a typed `tidegate.core.errors.SerializationError` that tells a bad frame
  (`WireFormatError`), an unknown schema id (`UnknownSchemaError`) and a body that does not match
  its schema (`SchemaMismatchError`) apart, so a poison pill is quarantined with the right reason.
"""

from __future__ import annotations

import contextlib
import io
import json
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import fastavro
import fastavro.schema
import fastavro.validation
from confluent_kafka.schema_registry import (
    Schema,
    SchemaRegistryClient,
    SchemaRegistryError,
    topic_subject_name_strategy,
)
from confluent_kafka.serialization import Deserializer, SerializationContext, Serializer
from fastavro.read import SchemaResolutionError

from tidegate.core.errors import (
    RegistryUnavailableError,
    SchemaMismatchError,
    SchemaNotFoundError,
    SubjectNotFoundError,
    TidegateError,
    UnknownSchemaError,
)
from tidegate.core.settings import SchemaRegistrySettings
from tidegate.schemas.catalog import ProjectSchema
from tidegate.schemas.wire import pack, unpack

__all__ = ["AvroDecoder", "AvroEncoder", "Registry", "SubjectNameStrategy", "registry_client"]

SubjectNameStrategy = Callable[[SerializationContext | None, str | None], str | None]

Registry = SchemaRegistrySettings | SchemaRegistryClient
"""Where a part finds the schema registry: settings, or a client the process already made."""


def registry_client(registry: Registry) -> SchemaRegistryClient:
    """`registry` if it is a client, else a new one from its settings. A process passes one client
    to all its parts: each costs about 40 ms of CPU to make (its TLS context) and has a schema
    cache of its own."""
    if isinstance(registry, SchemaRegistryClient):
        return registry
    return SchemaRegistryClient(registry.client_config())


# 40403 is Confluent's "schema not found"; its mock client answers the generic 40400.
_UNKNOWN_ID = (40403, 40400)


class AvroEncoder(Serializer):
    """Encodes dicts of one schema. The schema id comes from the registry, per subject."""

    def __init__(
        self,
        client: SchemaRegistryClient,
        schema: ProjectSchema,
        *,
        subject_name_strategy: SubjectNameStrategy = topic_subject_name_strategy,
        auto_register: bool = False,
    ) -> None:
        self._client = client
        self._schema = schema
        self._strategy = subject_name_strategy
        self._auto_register = auto_register
        self._ids: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, obj: Mapping[str, Any], ctx: SerializationContext | None = None) -> bytes:
        subject = self._strategy(ctx, self._schema.fullname)
        if subject is None:
            raise SchemaMismatchError("the subject name strategy gave no subject")
        schema_id = self._ids.get(subject)
        if schema_id is None:
            schema_id = self.schema_id(subject)
        return self.encode(obj, schema_id)

    def encode(self, obj: Mapping[str, Any], schema_id: int) -> bytes:
        """Encode with a known schema id, skipping the subject lookup."""
        buf = io.BytesIO()
        buf.write(pack(schema_id, b""))
        try:
            fastavro.schemaless_writer(buf, self._schema.parsed, obj)
        except Exception as exc:  # fastavro raises many types; the validator names the field
            raise SchemaMismatchError(self._explain(obj, exc)) from exc
        return buf.getvalue()

    def schema_id(self, subject: str) -> int:
        """The id of this encoder's schema under `subject`, registering it if so configured."""
        with self._lock:
            cached = self._ids.get(subject)
            if cached is not None:
                return cached
            schema = Schema(self._schema.text, "AVRO")
            with _registry_errors():
                if self._auto_register:
                    schema_id = int(self._client.register_schema(subject, schema))
                else:
                    found = self._client.lookup_schema(subject, schema).schema_id
                    if found is None:
                        raise SubjectNotFoundError(f"{self._schema.fullname} not under {subject}")
                    schema_id = int(found)
            self._ids[subject] = schema_id
            return schema_id

    def _explain(self, obj: Mapping[str, Any], exc: Exception) -> str:
        try:
            fastavro.validation.validate(obj, self._schema.parsed, raise_errors=True)
        except fastavro.validation.ValidationError as invalid:
            return f"record does not match {self._schema.fullname}: {invalid}"
        except Exception as other:  # the record may be too broken even for the validator
            return f"record does not match {self._schema.fullname}: {other}"
        return f"record does not match {self._schema.fullname}: {exc}"


class AvroDecoder(Deserializer):
    """Decodes framed bytes of any registered writer schema into dicts of the reader schema.

    With `return_record_name`, a value of a union with record branches is read as a
    `(full name, dict)` tuple, the same notation the encoder accepts to pick a branch, so a reader
    can tell records of like fields apart (the lifecycle event payloads).
    """

    def __init__(
        self,
        client: SchemaRegistryClient,
        reader: ProjectSchema | None = None,
        *,
        cache_size: int = 1000,
        return_record_name: bool = False,
    ) -> None:
        self._client = client
        self._return_record_name = return_record_name
        self._reader = reader.parsed if reader is not None else None
        self._reader_form = _canonical(self._reader) if reader is not None else None
        # schema id -> (writer, reader to resolve with, or None when resolution is a no-op). A
        # plain dict: a lookup is one atomic read on the hot path, where an LRU under a lock cost a
        # third of each decode. Writer ids are few; past `cache_size` the oldest is dropped.
        self._writers: dict[int, tuple[Any, Any]] = {}
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def __call__(self, data: bytes | None, ctx: SerializationContext | None = None) -> Any:
        schema_id, body = unpack(data)
        writer, reader = self._schemas(schema_id)
        buf = io.BytesIO(body)
        try:
            record = fastavro.schemaless_reader(
                buf, writer, reader, return_record_name=self._return_record_name
            )
        except SchemaResolutionError as exc:
            # fastavro's message quotes both schemas whole (20 KB for InferenceResult), which
            # every log line and dead-letter envelope of the message would repeat: name them.
            raise SchemaMismatchError(
                f"writer schema {schema_id} ({_name(writer)}) cannot be read as "
                f"{_name(reader if reader is not None else writer)}"
            ) from exc
        except Exception as exc:  # truncated or garbled bodies surface as many exception types
            raise SchemaMismatchError(
                f"body does not match writer schema {schema_id}: {type(exc).__name__}: {exc}"
            ) from exc
        if buf.tell() != len(body):
            raise SchemaMismatchError(
                f"body does not match writer schema {schema_id}: "
                f"{len(body) - buf.tell()} bytes left over after the record"
            )
        return record

    def writer_schema(self, schema_id: int) -> Any:
        """The parsed writer schema for an id, from the cache or the registry."""
        return self._schemas(schema_id)[0]

    def _schemas(self, schema_id: int) -> tuple[Any, Any]:
        cached = self._writers.get(schema_id)
        if cached is not None:
            return cached
        try:
            with _registry_errors():
                registered = self._client.get_schema(schema_id)
        except (SchemaNotFoundError, SubjectNotFoundError) as exc:
            raise UnknownSchemaError(schema_id) from exc
        if registered.schema_type not in (None, "AVRO"):
            raise UnknownSchemaError(
                schema_id, f"schema id {schema_id} is {registered.schema_type}, not AVRO"
            )
        writer = fastavro.parse_schema(json.loads(registered.schema_str or "null"))
        # Resolving against an identical reader only costs time (3x on the hot path), so the
        # reader is dropped when the writer has the same canonical form.
        same = self._reader_form is not None and _canonical(writer) == self._reader_form
        entry = (writer, None if same else self._reader)
        with self._lock:
            if len(self._writers) >= self._cache_size:
                self._writers.pop(next(iter(self._writers)))
            self._writers[schema_id] = entry
        return entry


def _name(parsed: Any) -> str:
    """A parsed schema's full name, or its type when it has none (a primitive, a union)."""
    if isinstance(parsed, dict):
        return str(parsed.get("name") or parsed.get("type"))
    if isinstance(parsed, list):
        return "a union"
    return str(parsed)


def _canonical(parsed: Any) -> str:
    return str(fastavro.schema.to_parsing_canonical_form(parsed))


@contextlib.contextmanager
def _registry_errors() -> Iterator[None]:
    """Translate registry client failures into the tidegate error tree."""
    try:
        yield
    except TidegateError:
        raise
    except SchemaRegistryError as exc:
        if exc.error_code in _UNKNOWN_ID:
            raise SchemaNotFoundError(exc.error_message) from exc
        if exc.error_code == SubjectNotFoundError.error_code:
            raise SubjectNotFoundError(exc.error_message) from exc
        if exc.http_status_code >= 500 or exc.http_status_code < 0:
            raise RegistryUnavailableError(str(exc)) from exc
        raise SchemaMismatchError(str(exc)) from exc
    except Exception as exc:
        # Anything else is the client failing to talk to the registry (its HTTP library varies
        # between confluent-kafka releases), which a later attempt may get past.
        raise RegistryUnavailableError(f"schema registry unreachable: {exc}") from exc
