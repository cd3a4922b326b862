"""Errors only the HTTP facade raises, as members of the tidegate error tree.

They are kept here, beside the one module that maps errors to HTTP (`tidegate.gateway.problems`),
because no other component meets them: a body that is too big, of the wrong media type or not JSON
at all, an unknown request id, a request id another caller holds, or a result store that cannot
be reached, or a request id whose request is still being published.
"""

from __future__ import annotations

from tidegate.core.errors import FatalError, InvalidInputError, RetriableError

__all__ = [
    "PayloadTooLargeError",
    "RequestIdTakenError",
    "RequestInFlightError",
    "RequestNotFoundError",
    "StoreUnavailableError",
    "UnsupportedMediaTypeError",
]


class PayloadTooLargeError(InvalidInputError):
    """The body is larger than the gateway accepts."""

    code = "PAYLOAD_TOO_LARGE"


class UnsupportedMediaTypeError(InvalidInputError):
    """The body's media type or content coding is not one the gateway reads."""

    code = "UNSUPPORTED_MEDIA_TYPE"


class RequestNotFoundError(FatalError):
    """No request with this id is known here, or its result has expired."""

    code = "REQUEST_NOT_FOUND"


class RequestIdTakenError(FatalError):
    """The request id a caller chose names a stored request of another caller (409)."""

    code = "REQUEST_ID_TAKEN"

    def __init__(self, request_id: str) -> None:
        super().__init__(f"request id {request_id!r} is taken; choose another or send none")
        self.request_id = request_id
        self.field = "id"


class RequestInFlightError(RetriableError):
    """A request with this id is still in flight, from another call of the same caller: being
    published, or waiting for its result (409). Retried later, the call learns its outcome."""

    code = "REQUEST_IN_FLIGHT"

    def __init__(self, request_id: str) -> None:
        super().__init__(
            f"a request with id {request_id!r} is still in flight (being published, or waiting "
            "for its result); retry later to learn its outcome"
        )
        self.request_id = request_id
        self.field = "id"


class StoreUnavailableError(RetriableError):
    """The result store (Redis) could not be reached."""

    code = "STORE_UNAVAILABLE"
