"""The Confluent wire format: magic byte 0, a 4-byte big-endian schema id, then the Avro body."""

from __future__ import annotations

import struct

from tidegate.core.errors import WireFormatError

__all__ = ["HEADER_SIZE", "MAGIC_BYTE", "pack", "unpack"]

MAGIC_BYTE = 0
HEADER_SIZE = 5
_HEADER = struct.Struct(">bI")


def pack(schema_id: int, body: bytes) -> bytes:
    return _HEADER.pack(MAGIC_BYTE, schema_id) + body


def unpack(data: bytes | None) -> tuple[int, memoryview]:
    """Split framed bytes into (schema id, body); a bad frame raises `WireFormatError`."""
    if data is None:
        raise WireFormatError("no value: a null (tombstone) message carries no record")
    if len(data) < HEADER_SIZE:
        raise WireFormatError(
            f"message of {len(data)} bytes is shorter than the {HEADER_SIZE}-byte wire header"
        )
    magic, schema_id = _HEADER.unpack_from(data)
    if magic != MAGIC_BYTE:
        if magic == 1:
            reason = "magic byte 1 (schema GUID framing) is not supported; expected 0"
        else:
            reason = f"unknown magic byte {magic}; expected {MAGIC_BYTE}"
        raise WireFormatError(reason)
    return schema_id, memoryview(data)[HEADER_SIZE:]
