"""Registry errors that `tidegate.core.errors` does not define, with Confluent's error codes.

They live here rather than in the shared error tree because only the registry raises them.
"""

from __future__ import annotations

from tidegate.core.errors import FatalError, SchemaRegistryError

__all__ = [
    "BadRequestError",
    "CompatibilityNotConfiguredError",
    "SchemaVersionNotSoftDeletedError",
    "SubjectNotSoftDeletedError",
]


class BadRequestError(SchemaRegistryError, FatalError):
    """The request body is not the JSON object the endpoint expects."""

    error_code = 400


class SubjectNotSoftDeletedError(SchemaRegistryError, FatalError):
    """A permanent subject delete needs a soft delete first (Confluent: 40405)."""

    error_code = 40405


class SchemaVersionNotSoftDeletedError(SchemaRegistryError, FatalError):
    """A permanent version delete needs a soft delete first (Confluent: 40407)."""

    error_code = 40407


class CompatibilityNotConfiguredError(SchemaRegistryError, FatalError):
    """The subject has no compatibility level of its own (Confluent: 40408)."""

    error_code = 40408
