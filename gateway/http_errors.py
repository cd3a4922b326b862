"""Errors only the HTTP facade raises, as members of the tidegate error tree.

They are kept here, beside the one module that maps errors to HTTP (`tidegate.gateway.problems`),
because no other component meets them: a body that is too big, of the wrong media type or not JSON
at all, an unknown request id, or a result store that cannot be reached.
"""

from __future__ import annotations

from tidegate.core.errors import FatalError, InvalidInputError, RetriableError

__all__ = [
    "PayloadTooLargeError",
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


class StoreUnavailableError(RetriableError):
    """The result store (Redis) could not be reached."""

    code = "STORE_UNAVAILABLE"
