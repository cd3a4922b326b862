"""Everything a worker does for one assigned partition: decode, batch, deliver in order, track.

Messages are decoded as they arrive; poison pills are quarantined at once. Requests go to the
partition's batch queue, and one delivery loop publishes their results strictly in offset order,
so results of one key come out in request order. Each offset is done once its result and dead
letters are acknowledged by Kafka; the tracker turns that into the position to commit.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message

from tidegate.agents import worker_metrics as metrics
from tidegate.agents.batching import PartitionBatcher
from tidegate.agents.decoding import KafkaMessage, RequestDecoder
from tidegate.agents.delivery import Publisher
from tidegate.agents.inference_task import InferenceTask
from tidegate.agents.offsets import OffsetTracker
from tidegate.agents.result_builders import FAILED_STATUSES, error_result
from tidegate.core.aio import cancel_and_wait
from tidegate.core.errors import ModelExecutionError, SerializationError, TidegateError
from tidegate.core.telemetry import get_logger
from tidegate.dlq.envelopes import dead_letter, error_info, source_position

__all__ = ["PartitionPipeline"]

log = get_logger(__name__)
Result = dict[str, Any]


@dataclass(slots=True, eq=False)
class _Slot:
    msg: KafkaMessage
    task: InferenceTask
    future: asyncio.Future[Result]


class PartitionPipeline:
    """Create inside the running loop; `close()` it when the partition is revoked."""

    def __init__(
        self,
        topic: str,
        partition: int,
        *,
        decoder: RequestDecoder,
        batcher: PartitionBatcher[InferenceTask, Result],
        publisher: Publisher,
        worker_id: str,
        on_fatal: Callable[[BaseException], None],
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.tracker = OffsetTracker()
        self._decoder = decoder
        self._batcher = batcher
        self._publisher = publisher
        self._worker_id = worker_id
        self._on_fatal = on_fatal
        self._slots: deque[_Slot] = deque()
        self._ready = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(
            self._deliver(), name=f"deliver-{topic}-{partition}"
        )

    def accept(self, msg: KafkaMessage) -> None:
        """Take one consumed message. A `RetriableError` (registry unreachable) propagates before
        the offset is tracked, so the caller can read the message again later."""
        decoded = self._decoder.decode(msg)
        offset = int(msg.offset() or 0)
        self.tracker.consumed(offset)
        task = decoded.task
        if decoded.poison is not None:
            self._quarantine(msg, offset, decoded.poison, task)
        if task is None:
            self.tracker.done(offset)
            return
        metrics.QUEUE.observe(task.queue_ms / 1000.0)
        self._slots.append(_Slot(msg, task, self._batcher.submit(self.partition, task)))
        self._ready.set()

    async def drain(self, within_s: float) -> bool:
        """Wait until every accepted message is delivered; False when `within_s` ran out."""
        deadline = time.monotonic() + within_s
        while self.tracker.in_flight:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    async def close(self) -> None:
        """Stop; what is not delivered yet is abandoned (and never committed)."""
        await cancel_and_wait([self._task])
        await self._batcher.drop(self.partition)
        for slot in self._slots:
            if slot.future.done() and not slot.future.cancelled():
                slot.future.exception()  # retrieved: an abandoned failure is not an error here
        self._slots.clear()

    async def _deliver(self) -> None:
        while True:
            while not self._slots:
                self._ready.clear()
                await self._ready.wait()
            slot = self._slots[0]
            try:
                result = await slot.future
            except Exception as exc:
                # The batch failed as a whole (the queue guarantees every member hears of it).
                result = error_result(slot.task, exc, worker_id=self._worker_id)
            self._publish(slot, result)
            self._slots.popleft()

    def _publish(self, slot: _Slot, result: Result) -> None:
        msg, task = slot.msg, slot.task
        offset = int(msg.offset() or 0)
        key = msg.key() or (task.request.get("routing_key") or task.request_id).encode()
        ack = partial(self._acked, offset)
        try:
            value = self._publisher.encode_result(result)
            sent = self._publisher.result(value, key, task.request.get("reply_to"), ack)
        except (SerializationError, KafkaException) as exc:
            # Too large for Kafka, or not encodable: answer with the error instead.
            failure = ModelExecutionError(f"the result could not be published: {exc}")
            result = error_result(task, failure, worker_id=self._worker_id)
            value = self._publisher.encode_result(result)
            sent = self._publisher.result(value, key, task.request.get("reply_to"), ack)
        self.tracker.expect(offset, sent)
        if result["status"] in FAILED_STATUSES:
            self._dead_letter(self._publisher.topics.failed, msg, offset, result["error"], task)
        self.tracker.done(offset)

    def _quarantine(
        self, msg: KafkaMessage, offset: int, error: TidegateError, task: InferenceTask | None
    ) -> None:
        info = error_info(error, details={"stage": "decode"})
        log.warning("poison pill at %s[%d]@%d: %s", self.topic, self.partition, offset, error)
        self._dead_letter(self._publisher.topics.poison, msg, offset, info, task)

    def _dead_letter(
        self,
        topic: str,
        msg: KafkaMessage,
        offset: int,
        error: Result,
        task: InferenceTask | None,
    ) -> None:
        now = int(time.time() * 1000)
        ts_type, ts = msg.timestamp()
        envelope = dead_letter(
            source=source_position(self.topic, self.partition, offset),
            error=error,
            key=msg.key(),
            value=msg.value(),
            headers=msg.headers(),
            timestamp_ms=ts if ts_type and ts >= 0 else None,
            failed_at_ms=now,
            attempt=task.attempts if task is not None else 1,
            request_id=task.request_id if task is not None else None,
            model=task.model if task is not None else None,
            worker_id=self._worker_id,
        )
        self.tracker.expect(offset)
        self._publisher.dead_letter(topic, envelope, msg.key(), partial(self._acked, offset))
        metrics.DEAD_LETTERS.labels(topic, str(error["code"])).inc()

    def _acked(self, offset: int, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            # The idempotent producer already retried until delivery.timeout.ms; the offset
            # stays uncommitted and the worker stops, so another one redoes it.
            self._on_fatal(KafkaException(err))
            return
        self.tracker.done(offset)
