"""Reading an inference request body within the size limit, and only in media types we read.

A declared Content-Length over the limit is refused before a byte of the body is read; a body
without one (chunked) is refused as soon as the bytes streamed in pass the limit, so an oversized
body never sits in memory whole.
"""

from __future__ import annotations

from fastapi import Request

from tidegate.core.errors import MalformedRequestError
from tidegate.gateway.http_errors import (
    PayloadTooLargeError,
    UnsupportedMediaTypeError,
)

__all__ = ["ACCEPTED_MEDIA_TYPES", "read_body"]

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
