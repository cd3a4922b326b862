"""Fakes of what a worker delivers through: Kafka messages, a publisher that records,
requests, a decoder and a batch handler."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from tidegate.agents.inference.result_builders import Timings, error_result, ok_result
from tidegate.agents.kafka_io.delivery import Ack
from tidegate.agents.tasks.inference_task import InferenceTask
from tidegate.core.errors import ModelExecutionError, UnknownSchemaError, WireFormatError
from tidegate.core.settings import TopicSettings
from tidegate.schemas.records import ReplyToRecord, RequestRecord, ResultRecord

__all__ = ["TOPICS", "Message", "Publisher", "decode", "handler", "request"]


TOPICS = TopicSettings()


class Message:
    def __init__(self, offset: int, value: bytes | None, key: bytes | None = b"k") -> None:
        self._offset, self._value, self._key = offset, value, key

    def topic(self) -> str:
        return "requests"

    def partition(self) -> int:
        return 2

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[tuple[str, bytes | None]]:
        return [("trace", b"abc")]

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000)


class Publisher:
    """Records what would be produced and holds each acknowledgement until the test gives it."""

    topics = TOPICS

    def __init__(self) -> None:
        self.results: list[ResultRecord] = []
        self.letters: list[tuple[str, dict[str, Any]]] = []
        self.pending: list[Ack] = []

    def encode_result(self, result: ResultRecord) -> bytes:
        self.results.append(result)
        return str(result["request_id"]).encode()

    def result(
        self,
        value: bytes,
        key: bytes | None,
        reply_to: ReplyToRecord | None,
        ack: Ack,
        headers: Any = None,
        *,
        keyed: bool = True,
        reply_ack: Any = None,
        batch: Any = None,
    ) -> int:
        self.pending.append(ack)
        return 1

    def dead_letter(
        self, topic: str, envelope: dict[str, Any], key: bytes | None, ack: Ack
    ) -> None:
        self.letters.append((topic, envelope))
        self.pending.append(ack)

    def ack_all(self) -> None:
        acks, self.pending = self.pending, []
        for ack in acks:
            ack(None, None)  # type: ignore[arg-type]


def request(rid: str, data: bytes | None = None) -> RequestRecord:
    return {
        "request_id": rid,
        "model": "fraud",
        "routing_key": None,
        "inputs": [
            {
                "name": "features",
                "datatype": "FP32",
                "shape": [1, 2],
                "data": data if data is not None else struct.pack("<2f", 1, 2),
                "parameters": {},
            }
        ],
        "created_at": 1_700_000_000_000,
    }


def decode(data: bytes | None, ctx: Any = None) -> RequestRecord:
    """`b"rid"` decodes, `b"short:rid"` has a truncated tensor, anything with `!` is garbage."""
    text = (data or b"").decode()
    if "!" in text:
        raise WireFormatError("unknown magic byte 33; expected 0")
    if text == "unknown-id":
        raise UnknownSchemaError(999)
    if text.startswith("short:"):
        return request(text[6:], b"\x00\x01\x02")
    return request(text)


async def handler(tasks: Sequence[InferenceTask], waits: Sequence[float]) -> list[ResultRecord]:
    out: list[ResultRecord] = []
    for task in tasks:
        if task.rejection is not None:
            out.append(error_result(task, task.rejection, worker_id="w"))
        elif task.request_id.startswith("fail"):
            task.attempts = 3
            out.append(error_result(task, ModelExecutionError("nan"), worker_id="w", version="1"))
        else:
            out.append(ok_result(task, [], version="1", timings=Timings(), worker_id="w"))
    return out
