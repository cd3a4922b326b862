"""From a Kafka message to an `InferenceTask`, or to the reason it is a poison pill.

Bytes the codec cannot decode (bad frame, unknown schema id, body not matching its schema) are
poison. So is a tensor whose data does not fit its own shape and datatype: the request is then
also answered INVALID, since its id (and so a waiting caller) is known. So is a `reply_to` that
names anything but a partition of the replies topic: anyone who may produce requests could
otherwise write results into any topic the worker may write, or into a gateway's waiting calls.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from tidegate.agents.tasks.inference_task import InferenceTask
from tidegate.core.errors import InvalidInputError, SerializationError, TidegateError
from tidegate.dlq.envelopes import source_position
from tidegate.dlq.redelivery import read_lineage
from tidegate.schemas.records import ReplyToRecord, TensorRecord
from tidegate.schemas.tensors import DATATYPES, to_numpy

__all__ = ["Decoded", "KafkaMessage", "RequestDecoder"]


class KafkaMessage(Protocol):
    """The part of confluent-kafka's `Message` the worker reads."""

    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...
    def headers(self) -> Any: ...
    def timestamp(self) -> tuple[int, int]: ...


class Decoder(Protocol):
    def __call__(self, data: bytes | None, ctx: Any = None) -> Any: ...


@dataclass(slots=True)
class Decoded:
    """`task` is None when nothing could be decoded; `poison` says why the message is poison."""

    task: InferenceTask | None
    poison: TidegateError | None


class RequestDecoder:
    """`reply_refusal` says why a request's `reply_to` is not honoured
    (`ResultPublisher.reply_refusal`): such a request is poison with that reason, answered INVALID
    on the results topic only."""

    def __init__(
        self,
        decoder: Decoder,
        reply_refusal: Callable[[ReplyToRecord | None], str | None] | None = None,
    ) -> None:
        self._decoder = decoder
        self._reply_refusal = reply_refusal

    def decode(self, msg: KafkaMessage) -> Decoded:
        """Decode one message. A `RetriableError` (registry unreachable) propagates: the message
        is not poison and must be read again."""
        try:
            record = self._decoder(msg.value())
        except SerializationError as exc:
            return Decoded(None, exc)
        now_ms = time.time() * 1000.0
        ts_type, ts = msg.timestamp()
        position = source_position(str(msg.topic()), msg.partition() or 0, msg.offset() or 0)
        raw = msg.value() or b""
        task = InferenceTask(
            record,
            source=position,
            received_ms=now_ms,
            queue_ms=max(0.0, now_ms - ts) if ts_type and ts > 0 else 0.0,
            lineage=read_lineage(msg.headers()),
            # The wire header's schema id, and a digest of the body after it: the lineage index
            # tells a redelivery of the same request from a reused id with other content. A
            # BLAKE2b of a request's few hundred bytes is about a microsecond.
            schema_id=int.from_bytes(raw[1:5], "big"),
            digest=hashlib.blake2b(memoryview(raw)[5:], digest_size=16).hexdigest(),
        )
        if self._reply_refusal is not None and record.get("reply_to"):
            refused = self._reply_refusal(record["reply_to"])
            if refused is not None:
                record["reply_to"] = None  # never produced to
                task.rejection = InvalidInputError(refused, "reply_to")
                return Decoded(task, task.rejection)
        arrays: dict[str, Any] = {}
        for tensor in record["inputs"]:
            if tensor["datatype"] not in DATATYPES:
                # Not malformed, only unsupported: the signature check answers INVALID.
                continue
            try:
                arrays[tensor["name"]] = _array(tensor)
            except InvalidInputError as exc:
                task.rejection = exc
                return Decoded(task, exc)
        task.arrays = arrays
        return Decoded(task, None)


def _array(tensor: TensorRecord) -> npt.NDArray[Any]:
    """`to_numpy`, with a shortcut for the common well-formed numeric tensor; anything else goes
    through `to_numpy`, which also words the errors."""
    datatype, shape, data = tensor["datatype"], tensor["shape"], tensor["data"]
    if datatype != "BYTES" and min(shape, default=0) >= 0:
        dtype = DATATYPES[datatype]
        if len(data) == math.prod(shape) * dtype.itemsize:
            return np.frombuffer(data, dtype=dtype).reshape(shape)
    return to_numpy(tensor)
