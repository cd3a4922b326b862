"""The one error tree of tidegate.

Every error is a `TidegateError` and says whether retrying can help (`retriable`). Dead-letter
routing goes by that flag: retriable errors go to the retry path, fatal ones to the dead-letter
queue or, for undecodable bytes, to the poison-pill quarantine. HTTP status codes are chosen only
by HTTP adapters (`gateway/`); domain code never names one.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "ArtifactError",
    "ArtifactIntegrityError",
    "AuthenticationError",
    "ConcurrencyConflictError",
    "ConfigurationError",
    "CrashLoopError",
    "DeadlineExceededError",
    "FatalError",
    "IncompatibleSchemaError",
    "InferenceError",
    "InvalidCompatibilityLevelError",
    "InvalidInputError",
    "InvalidSchemaError",
    "InvalidTransitionError",
    "InvalidVersionError",
    "LifecycleError",
    "LifecycleUnavailableError",
    "MalformedRequestError",
    "ModelExecutionError",
    "ModelNotFoundError",
    "ModelTimeoutError",
    "ModelUnavailableError",
    "OverloadedError",
    "PermissionDeniedError",
    "PromotionGateError",
    "RateLimitedError",
    "RegistryUnavailableError",
    "ResultTimeoutError",
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
    """Root of every error tidegate raises on purpose.

    `code` is the stable machine-readable name carried in result and dead-letter envelopes.
    """

    retriable: ClassVar[bool] = False
    code: ClassVar[str] = "INTERNAL"


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

    code = "UNDECODABLE"


class WireFormatError(SerializationError):
    """The bytes are not in the Confluent wire format: too short, or the magic byte is wrong."""

    code = "WIRE_FORMAT"


class UnknownSchemaError(SerializationError):
    """The wire format is right but the registry does not know the schema id."""

    code = "UNKNOWN_SCHEMA"

    def __init__(self, schema_id: int, message: str | None = None) -> None:
        super().__init__(message or f"unknown schema id {schema_id}")
        self.schema_id = schema_id


class SchemaMismatchError(SerializationError):
    """The body does not match the writer schema, or the record does not match the schema."""

    code = "SCHEMA_MISMATCH"


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


class InferenceError(TidegateError):
    """A request could not be served. Subclasses say why; the request gets a result that says so."""


class ModelNotFoundError(InferenceError, FatalError):
    """No such model, or no such version that may serve."""

    code = "NOT_FOUND"


class InvalidInputError(InferenceError, FatalError):
    """The inputs do not match the model signature. `field` names the input at fault."""

    code = "INVALID_INPUT"

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class MalformedRequestError(InvalidInputError):
    """The body is not a V2 request at all: bad JSON, bad framing of the binary extension."""

    code = "MALFORMED_REQUEST"


class DeadlineExceededError(InferenceError, FatalError):
    """The request's deadline passed before it was computed."""

    code = "DEADLINE_EXCEEDED"


class ModelExecutionError(InferenceError, FatalError):
    """The model itself failed on this input."""

    code = "MODEL_ERROR"


class ModelUnavailableError(InferenceError, RetriableError):
    """The model cannot serve right now (loading, unloading, its worker is gone, or its circuit
    breaker is open). `retry_after_s`, when known, is when it may serve again."""

    code = "UNAVAILABLE"

    def __init__(self, message: str = "", retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ModelTimeoutError(InferenceError, RetriableError):
    """A batch ran past its model's timeout; its members may succeed in another batch."""

    code = "MODEL_TIMEOUT"


class CrashLoopError(InferenceError, FatalError):
    """Processing this message killed a worker process again and again: it is quarantined."""

    code = "CRASH_LOOP"


class OverloadedError(InferenceError, RetriableError):
    """Load was shed at the edge rather than queued without bound. `retry_after_s`, when known,
    estimates when there is room again (the queueing delay ahead)."""

    code = "OVERLOADED"

    def __init__(self, message: str = "", retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RateLimitedError(RetriableError):
    """The caller (or the model, across every caller) is over its rate limit. Retriable: the same
    call succeeds once the window has room, which `retry_after_s` estimates."""

    code = "RATE_LIMITED"

    def __init__(self, retry_after_s: float, message: str | None = None) -> None:
        super().__init__(message or f"rate limit exceeded; retry after {retry_after_s:.1f} s")
        self.retry_after_s = retry_after_s


class ResultTimeoutError(InferenceError, RetriableError):
    """No result arrived in time; the request may still complete and be fetched later."""

    code = "TIMEOUT"


class ArtifactError(FatalError):
    """A model artifact is missing, malformed or corrupted; it is never served."""

    code = "ARTIFACT"


class ArtifactIntegrityError(ArtifactError):
    """A file's sha256 does not match its manifest."""

    code = "ARTIFACT_INTEGRITY"


class LifecycleError(FatalError):
    """A model lifecycle event or command is malformed."""

    code = "LIFECYCLE"


class ConcurrencyConflictError(LifecycleError):
    """The stream moved on since it was read: nothing was appended; read again and decide again."""

    code = "CONFLICT"

    def __init__(self, stream: str, expected: int, actual: int) -> None:
        super().__init__(
            f"model {stream!r} changed concurrently: expected version {expected}, found {actual}"
        )
        self.stream = stream
        self.expected = expected
        self.actual = actual


class InvalidTransitionError(LifecycleError):
    """The command does not apply to the current state, e.g. promoting a retired version."""

    code = "INVALID_TRANSITION"


class PromotionGateError(InvalidTransitionError):
    """A promotion gate (shadow agreement, a passing backtest) is not met and `--force` was not
    given."""

    code = "PROMOTION_GATE"


class LifecycleUnavailableError(RetriableError):
    """The event store (PostgreSQL) cannot be reached right now."""

    code = "LIFECYCLE_UNAVAILABLE"


class AuthenticationError(FatalError):
    """The caller did not say who it is, or said it with credentials that do not hold: missing,
    malformed, unknown, wrongly signed, revoked or expired. `reason` is the precise cause, for
    the audit trail; the message is what the caller is told, which never echoes a credential."""

    code = "UNAUTHENTICATED"

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason or message


class PermissionDeniedError(FatalError):
    """The caller is known, but none of its grants allows this on this model."""

    code = "PERMISSION_DENIED"
