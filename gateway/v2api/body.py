"""Reading an inference request body within the size limit, and only in media types we read.

A declared Content-Length over the limit is refused before a byte of the body is read; a body
without one (chunked) is refused as soon as the bytes streamed in pass the limit, so an oversized
body never sits in memory whole.

Parsed JSON costs far more memory than its text: each element becomes a Python object, about
24 bytes, whatever its size in the body. `check_elements` refuses, before parsing, a JSON header
with more elements than any request record could carry (each takes at least a byte of the
record), so what one call can make the gateway hold is bounded by the record cap, not the body's.
"""

from __future__ import annotations

from fastapi import Request

from tidegate.core.errors import MalformedRequestError
from tidegate.gateway.http_errors import (
    PayloadTooLargeError,
    UnsupportedMediaTypeError,
)

__all__ = ["ACCEPTED_MEDIA_TYPES", "check_elements", "read_body"]

# JSON, and octet-stream for the binary extension; tritonclient sends no Content-Type at all.
ACCEPTED_MEDIA_TYPES = frozenset({"", "application/json", "application/octet-stream"})


def _check_media(request: Request) -> None:
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media not in ACCEPTED_MEDIA_TYPES:
        raise UnsupportedMediaTypeError(
            f"media type {media!r} is not supported; send application/json, or "
            "application/octet-stream with Inference-Header-Content-Length",
            "Content-Type",
        )
    coding = request.headers.get("content-encoding", "identity").strip().lower()
    if coding != "identity":
        raise UnsupportedMediaTypeError(
            f"content coding {coding!r} is not supported", "Content-Encoding"
        )


def check_elements(header: bytes, max_record_bytes: int) -> None:
    """Refuse (413) a JSON header that holds more values than a record of `max_record_bytes`
    could: every comma separates one from the next, or is itself a byte of a string."""
    if header.count(b",") >= max_record_bytes:
        raise PayloadTooLargeError(
            f"the JSON body holds more values than a request record of at most "
            f"{max_record_bytes} bytes can carry; send fewer, or the tensors as binary data "
            "(Inference-Header-Content-Length)"
        )


async def read_body(request: Request, max_bytes: int) -> bytes:
    _check_media(request)
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            length = int(declared)
        except ValueError:
            raise MalformedRequestError(
                "Content-Length is not an integer", "Content-Length"
            ) from None
        if length > max_bytes:
            raise PayloadTooLargeError(
                f"the body of {length} bytes exceeds the limit of {max_bytes}", "Content-Length"
            )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLargeError(f"the body exceeds the limit of {max_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
