"""Prediction cache keys and values: what makes two requests the same question for one version.

The worker and the gateway share this module, so an entry one of them stores is found by the
other. No I/O here: the Redis round trips belong to the callers.

A key hashes, in a fixed order: the request's tenant (so a hit never tells one tenant what
another asked), the model, the version, the requested outputs (in the order asked, since that is
the order they are answered in), the request parameters that may change the answer (all of them
but the transport-only ones, sorted by name, each with its type) and the input tensors sorted by
name, each as name, datatype, shape and raw data. Every piece is length-prefixed, so no two
different requests concatenate to the same bytes. The model and version are also in the
key's text, so an operator can see (and `SCAN`) a version's entries.

A value holds the result's output tensors: a JSON header (name, datatype, shape and data length of
each) and then their raw data, so a hit costs one JSON parse of a few dozen bytes and no numpy.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tidegate.schemas.records import TensorRecord

__all__ = [
    "FALLBACK_PREFIX",
    "UNCACHED_PARAMETERS",
    "cacheable_result",
    "decode_outputs",
    "encode_outputs",
    "prediction_key",
]

# Parameters that say how or when to answer, never what: a deadline (Triton's `timeout`), a lane,
# and the HTTP body's binary layout. Any other parameter is part of the question.
UNCACHED_PARAMETERS = frozenset(
    {"timeout", "priority", "lane", "binary_data", "binary_data_output", "binary_data_size"}
)
FALLBACK_PREFIX = "fallback:"
"""Routing rules of an answer by another model (a fallback): its version names that model's."""
_MAGIC = b"TGPC1"
_LEN = struct.Struct("<I")
_VERSION = b"tidegate-prediction-key-2"


def _framed(parts: list[bytes], raw: bytes) -> None:
    parts.append(_LEN.pack(len(raw)))
    parts.append(raw)


def prediction_key(
    prefix: str,
    model: str,
    version: str,
    inputs: Iterable[Mapping[str, Any]],
    outputs: Sequence[str] = (),
    parameters: Mapping[str, Any] | None = None,
    *,
    tenant: str,
) -> str:
    """The Redis key of one request's answer by `model` `version` for `tenant` (`inputs` are
    `Tensor` records: name, datatype, shape, raw data). Each tenant has its own entries: a hit
    (`cached: true`) must not tell one tenant what another asked."""
    parts: list[bytes] = [_VERSION]
    _framed(parts, tenant.encode())
    _framed(parts, model.encode())
    _framed(parts, version.encode())
    parts.append(_LEN.pack(len(outputs)))
    for name in outputs:
        _framed(parts, name.encode())
    params = sorted(
        (name, value)
        for name, value in (parameters or {}).items()
        if name not in UNCACHED_PARAMETERS
    )
    parts.append(_LEN.pack(len(params)))
    for name, value in params:
        _framed(parts, name.encode())
        # The type is part of the value: 1, 1.0, True and "1" are different parameters.
        _framed(parts, f"{type(value).__name__}:{value!r}".encode())
    tensors = sorted(inputs, key=lambda tensor: str(tensor["name"]))
    parts.append(_LEN.pack(len(tensors)))
    for tensor in tensors:
        _framed(parts, str(tensor["name"]).encode())
        _framed(parts, str(tensor["datatype"]).encode())
        shape = tensor["shape"]
        _framed(parts, struct.pack(f"<{len(shape)}q", *shape))
        _framed(parts, tensor["data"])
    # One hash call over the joined frames: a few small `update`s cost more than the hashing.
    digest = hashlib.blake2b(b"".join(parts), digest_size=16).hexdigest()
    return f"{prefix}{model}:{version}:{digest}"


def cacheable_result(result: Mapping[str, Any]) -> bool:
    """Whether a result may be stored: a computed OK answer of the model it names. A fallback's
    answer is not, since its version is another model's and would be stored under this one."""
    rule = result.get("routing_rule") or ""
    return (
        result.get("status") == "OK"
        and bool(result.get("model_version"))
        and not result.get("cached")
        and not rule.startswith(FALLBACK_PREFIX)
    )


def encode_outputs(outputs: Sequence[TensorRecord]) -> bytes:
    """A cache value: the output `Tensor` records (their parameters are not kept)."""
    header = [
        [str(t["name"]), str(t["datatype"]), [int(d) for d in t["shape"]], len(t["data"])]
        for t in outputs
    ]
    head = json.dumps(header, separators=(",", ":")).encode()
    return b"".join([_MAGIC, _LEN.pack(len(head)), head, *(bytes(t["data"]) for t in outputs)])


def decode_outputs(value: bytes) -> list[TensorRecord]:
    """The output `Tensor` records of a cache value; `ValueError` when it is not one (written by
    another release, or damaged), which its readers treat as a miss."""
    view = memoryview(value)
    start = len(_MAGIC) + _LEN.size
    if len(view) < start or bytes(view[: len(_MAGIC)]) != _MAGIC:
        raise ValueError("not a prediction cache value")
    (size,) = _LEN.unpack_from(view, len(_MAGIC))
    try:
        header = json.loads(bytes(view[start : start + size]))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"damaged prediction cache header: {exc}") from None
    pos = start + size
    tensors: list[TensorRecord] = []
    try:
        for name, datatype, shape, length in header:
            if pos + length > len(view):
                raise ValueError("truncated prediction cache value")
            data = bytes(view[pos : pos + length])
            pos += length
            tensors.append(
                {"name": name, "datatype": datatype, "shape": shape, "data": data, "parameters": {}}
            )
    except TypeError as exc:  # a header of another shape
        raise ValueError(f"damaged prediction cache header: {exc}") from None
    if pos != len(view):
        raise ValueError("prediction cache value has trailing bytes")
    return tensors
