"""The one error tree of tidegate.

Every error is a `TidegateError` and says whether retrying can help (`retriable`). Dead-letter
routing goes by that flag: retriable errors go to the retry path, fatal ones to the dead-letter
queue or, for undecodable bytes, to the poison-pill quarantine. HTTP status codes are chosen only
by HTTP adapters (`gateway/`); domain code never names one.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "ConfigurationError",
    "FatalError",
    "IncompatibleSchemaError",
    "InvalidCompatibilityLevelError",
    "InvalidSchemaError",
    "InvalidVersionError",
    "RegistryUnavailableError",
    "RetriableError",
    "SchemaMismatchError",
    "SchemaNotFoundError",
    "SchemaRegistryError",
    "SchemaVersionSoftDeletedError",
    "SerializationError",
    "StackError",
    "SubjectNotFoundError",
    "SubjectSoftDeletedError",
    "TidegateError",
    "UnknownSchemaError",
    "VersionNotFoundError",
    "WireFormatError",
]


class TidegateError(Exception):
    """Root of every error tidegate raises on purpose."""

    retriable: ClassVar[bool] = False


class RetriableError(TidegateError):
    """A transient failure: the same operation may succeed later."""

    retriable = True


class FatalError(TidegateError):
    """A permanent failure: retrying the same input gives the same error."""

    retriable = False


class ConfigurationError(FatalError):
    """Settings are missing or inconsistent."""


class StackError(FatalError):
    """A local stack server did not become healthy."""


class SerializationError(FatalError):
    """Bytes could not be turned into a record (or back). Such messages are poison pills."""


class WireFormatError(SerializationError):
    """The bytes are not in the Confluent wire format: too short, or the magic byte is wrong."""


class UnknownSchemaError(SerializationError):
    """The wire format is right but the registry does not know the schema id."""

    def __init__(self, schema_id: int, message: str | None = None) -> None:
        super().__init__(message or f"unknown schema id {schema_id}")
        self.schema_id = schema_id


class SchemaMismatchError(SerializationError):
    """The body does not match the writer schema, or the record does not match the schema."""


class SchemaRegistryError(TidegateError):
    """An error of the schema registry protocol, carrying Confluent's numeric error code."""

    error_code: ClassVar[int] = 50001


class SubjectNotFoundError(SchemaRegistryError, FatalError):
    error_code = 40401


class VersionNotFoundError(SchemaRegistryError, FatalError):
    error_code = 40402


class SchemaNotFoundError(SchemaRegistryError, FatalError):
    error_code = 40403


class SubjectSoftDeletedError(SchemaRegistryError, FatalError):
    """The subject was soft-deleted; a permanent delete must come first (Confluent: 40404)."""

    error_code = 40404


class SchemaVersionSoftDeletedError(SchemaRegistryError, FatalError):
    """The version was soft-deleted; a permanent delete must come first (Confluent: 40406)."""

    error_code = 40406


class IncompatibleSchemaError(SchemaRegistryError, FatalError):
    """The schema breaks the subject's compatibility level. `messages` names each field at fault."""

    error_code = 409

    def __init__(self, message: str, messages: list[str] | None = None) -> None:
        super().__init__(message)
        self.messages = messages or []


class InvalidSchemaError(SchemaRegistryError, FatalError):
    error_code = 42201


class InvalidVersionError(SchemaRegistryError, FatalError):
    error_code = 42202


class InvalidCompatibilityLevelError(SchemaRegistryError, FatalError):
    error_code = 42203


class RegistryUnavailableError(SchemaRegistryError, RetriableError):
    """The registry could not be reached, or its backing store is not ready."""

    error_code = 50003
