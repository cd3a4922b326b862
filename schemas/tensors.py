"""V2 tensors: between the Avro `Tensor` record and numpy arrays.

Numeric data is little-endian raw bytes in row-major order. A BYTES tensor holds each element as a
4-byte little-endian length followed by its bytes, which is Triton's binary tensor layout, so the
same bytes pass through the HTTP binary extension and Kafka untouched.
"""

from __future__ import annotations

import math
import struct
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from tidegate.core.errors import InvalidInputError
from tidegate.schemas.records import Datatype, TensorRecord

__all__ = [
    "DATATYPES",
    "datatype_of",
    "decode_bytes_elements",
    "encode_bytes_elements",
    "from_numpy",
    "to_numpy",
]

# V2 datatype -> numpy dtype (little-endian). BYTES maps to object arrays of `bytes`.
DATATYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}
_BY_KIND = {dt.str: cast(Datatype, name) for name, dt in DATATYPES.items() if name != "BYTES"}
_LEN = struct.Struct("<I")


def datatype_of(array: npt.NDArray[Any]) -> Datatype:
    if array.dtype == object or array.dtype.kind in ("S", "U"):
        return "BYTES"
    name = _BY_KIND.get(array.dtype.newbyteorder("<").str)
    if name is None:
        raise InvalidInputError(f"dtype {array.dtype} has no V2 datatype")
    return name


def encode_bytes_elements(items: Any) -> bytes:
    out = bytearray()
    for item in np.asarray(items, dtype=object).reshape(-1):
        raw = item.encode() if isinstance(item, str) else bytes(item)
        out += _LEN.pack(len(raw))
        out += raw
    return bytes(out)


def decode_bytes_elements(data: bytes, count: int, name: str) -> npt.NDArray[Any]:
    items: list[bytes] = []
    view = memoryview(data)
    pos = 0
    for _ in range(count):
        if pos + 4 > len(view):
            raise InvalidInputError(
                f"BYTES tensor {name!r} holds fewer than {count} elements", name
            )
        (size,) = _LEN.unpack_from(view, pos)
        pos += 4
        if pos + size > len(view):
            raise InvalidInputError(f"BYTES tensor {name!r} has a truncated element", name)
        items.append(bytes(view[pos : pos + size]))
        pos += size
    if pos != len(view):
        raise InvalidInputError(f"BYTES tensor {name!r} has {len(view) - pos} bytes too many", name)
    out = np.empty(count, dtype=object)
    out[:] = items
    return out


def to_numpy(tensor: TensorRecord) -> npt.NDArray[Any]:
    """Decode an Avro `Tensor` record; data that does not fit the shape is `InvalidInputError`."""
    name, datatype, shape = tensor["name"], tensor["datatype"], list(tensor["shape"])
    if any(d < 0 for d in shape):
        raise InvalidInputError(f"tensor {name!r} has a negative dimension {shape}", name)
    dtype = DATATYPES.get(datatype)
    if dtype is None:
        raise InvalidInputError(f"tensor {name!r} has unsupported datatype {datatype}", name)
    count = math.prod(shape)
    data: bytes = tensor["data"]
    if datatype == "BYTES":
        return decode_bytes_elements(data, count, name).reshape(shape)
    if len(data) != count * dtype.itemsize:
        raise InvalidInputError(
            f"tensor {name!r} of shape {shape} and {datatype} needs {count * dtype.itemsize} "
            f"bytes, got {len(data)}",
            name,
        )
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def from_numpy(name: str, array: npt.NDArray[Any]) -> TensorRecord:
    """Encode an array as an Avro `Tensor` record."""
    datatype = datatype_of(array)
    if datatype == "BYTES":
        data = encode_bytes_elements(array)
    else:
        data = np.ascontiguousarray(array, dtype=DATATYPES[datatype]).tobytes()
    return {
        "name": name,
        "datatype": datatype,
        "shape": list(array.shape),
        "data": data,
        "parameters": {},
    }
