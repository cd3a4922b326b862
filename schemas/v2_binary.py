"""Triton's binary tensor data extension: JSON header plus raw tensor bytes in one HTTP body.

A request or response that uses it carries `Inference-Header-Content-Length`, the byte length of the
JSON header at the start of the body; the raw tensors follow back to back, in the order of the
tensors in the header whose `parameters.binary_data_size` gives each one's length. Raw data is the
V2 layout of `tidegate.schemas.tensors` (little-endian elements; BYTES as 4-byte length + bytes), so
it passes between HTTP and Kafka without conversion.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from tidegate.core.errors import MalformedRequestError

__all__ = ["HEADER_LENGTH", "BinarySection", "join_body", "split_body"]

HEADER_LENGTH = "Inference-Header-Content-Length"


def split_body(body: bytes, header_length: str | None) -> tuple[bytes, BinarySection]:
    """Split a request body into its JSON header and its binary section."""
    if header_length is None:
        return body, BinarySection(b"")
    try:
        size = int(header_length)
    except ValueError:
        size = -1
    if not 0 <= size <= len(body):
        raise MalformedRequestError(
            f"{HEADER_LENGTH} must be an integer between 0 and the body length {len(body)}, "
            f"got {header_length!r}",
            HEADER_LENGTH,
        )
    return body[:size], BinarySection(body[size:])


class BinarySection:
    """The raw tensors after the JSON header, taken in order."""

    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)
        self._pos = 0

    def take(self, size: Any, field: str) -> bytes:
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise MalformedRequestError(f"{field} must be a non-negative integer", field)
        if self._pos + size > len(self._data):
            raise MalformedRequestError(
                f"{field} asks for {size} bytes but only {len(self._data) - self._pos} remain "
                "in the binary section",
                field,
            )
        chunk = bytes(self._data[self._pos : self._pos + size])
        self._pos += size
        return chunk

    def check_consumed(self) -> None:
        left = len(self._data) - self._pos
        if left:
            raise MalformedRequestError(
                f"the binary section has {left} bytes that no tensor claims", HEADER_LENGTH
            )


def join_body(header: Mapping[str, Any], parts: Sequence[bytes]) -> tuple[bytes, int | None]:
    """Serialize a response; with binary parts, also the header length to send with it."""
    head = json.dumps(header, separators=(",", ":")).encode()
    if not parts:
        return head, None
    return head + b"".join(parts), len(head)
