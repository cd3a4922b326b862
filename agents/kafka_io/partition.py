"""What a worker keeps for one assigned partition: its requests in offset order, and its tracker.

Messages are decoded as they arrive; poison pills are quarantined at once. Each request becomes a
`Slot`, which the worker batches with requests of every other partition for the same model.
Batches may finish in any order, but `answered()` hands results to the sink only as a prefix of
the partition, so results of one key come out in request order. Each offset is done once the sink
released every record it produced for it; the tracker turns that into the position to commit.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from tidegate.agents import worker_metrics as metrics
from tidegate.agents.inference.result_builders import error_result
from tidegate.agents.kafka_io.failures import FailureRouter, KeyHolds
from tidegate.agents.kafka_io.offsets import OffsetTracker
from tidegate.agents.kafka_io.sinks import ResultSink, SinkEntry
from tidegate.agents.tasks.decoding import KafkaMessage, RequestDecoder
from tidegate.agents.tasks.inference_task import InferenceTask
from tidegate.core.telemetry import get_logger
from tidegate.dlq.envelopes import error_info
from tidegate.schemas.records import ErrorRecord, ResultRecord

__all__ = ["PartitionPipeline", "Slot", "hand_over"]

log = get_logger(__name__)
_REHOLD_MS = 100


@dataclass(slots=True, eq=False)
class Slot:
    """One request of a partition, waiting for its result."""

    pipeline: PartitionPipeline
    msg: KafkaMessage
    offset: int
    task: InferenceTask
    result: ResultRecord | None = None


class PartitionPipeline:
    def __init__(
        self,
        topic: str,
        partition: int,
        *,
        decoder: RequestDecoder,
        sink: ResultSink,
        failures: FailureRouter,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.tracker = OffsetTracker()
        self.closed = False
        # The first offset consumed: where a rewind starts when no transaction committed yet.
        self.first_offset: int | None = None
        self._decoder = decoder
        self._sink = sink
        self._failures = failures
        self._holds = KeyHolds() if failures.hold_keys else None
        self._slots: deque[Slot] = deque()

    def accept(self, msg: KafkaMessage) -> Slot | None:
        """Take one consumed message; returns the request to batch, if it holds one. A
        `RetriableError` (registry unreachable) propagates before the offset is tracked, so the
        caller can read the message again later."""
        decoded = self._decoder.decode(msg)
        offset = int(msg.offset() or 0)
        if self.first_offset is None:
            self.first_offset = offset
        self.tracker.consumed(offset)
        task = decoded.task
        if decoded.poison is not None:
            info = error_info(decoded.poison, details={"stage": "decode"})
            log.warning(
                "poison pill at %s[%d]@%d: %s",
                self.topic,
                self.partition,
                offset,
                decoded.poison,
                extra={"request_id": task.request_id} if task is not None else None,
            )
            self._failures.quarantine(self._sink, self.tracker, msg, offset, info, task)
        if task is None:
            self.tracker.done(offset)
            return None
        metrics.QUEUE_WAITS.add(task.queue_ms / 1000.0)
        if self._holds is not None and self._held(msg, offset, task):
            return None
        slot = Slot(self, msg, offset, task)
        self._slots.append(slot)
        return slot

    def quarantine(self, msg: KafkaMessage, error: ErrorRecord) -> None:
        """Quarantine a message without decoding it (it crashed workers before)."""
        offset = int(msg.offset() or 0)
        if self.first_offset is None:
            self.first_offset = offset
        self.tracker.consumed(offset)
        self._failures.quarantine(self._sink, self.tracker, msg, offset, error, None)
        self.tracker.done(offset)
        self._sink.flush()
        key = msg.key()
        if self._holds is not None and key is not None:
            self._holds.release(key)

    def answered(self) -> None:
        """Hand the results at the head of the partition, in offset order, to the sink."""
        slots, sink, tracker = self._slots, self._sink, self.tracker
        while slots and slots[0].result is not None:
            slot = slots.popleft()
            result = slot.result
            assert result is not None  # noqa: S101 - checked by the loop condition
            msg, task, offset = slot.msg, slot.task, slot.offset
            key = msg.key() or (task.request.get("routing_key") or task.request_id).encode()
            if self._holds is not None and self._held(msg, offset, task):
                # Computed while an earlier request of its key was still in flight, which has
                # since gone to wait for a retry: this one waits behind it, result dropped.
                continue
            error = result["error"]
            retried = None
            if error is not None:
                version = result["model_version"]
                retried = self._failures.failed(sink, tracker, msg, offset, task, error, version)
            if retried is None:
                sink.add(SinkEntry(tracker, offset, key, result=result, task=task))
                if self._holds is not None:
                    self._holds.finished(key, task.request_id)
            elif self._holds is not None:
                self._holds.retried(key, task.request_id, *retried)
            tracker.done(offset)

    async def drain(self, within_s: float) -> bool:
        """Wait until every accepted message is done; False when `within_s` ran out."""
        deadline = time.monotonic() + within_s
        while self.tracker.in_flight:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    def close(self) -> None:
        """Stop; what is not delivered yet is abandoned (and never committed). Its requests may
        still be in a batch: their results are dropped when they come back."""
        self.closed = True
        self.tracker.closed = True
        self._slots.clear()

    def _held(self, msg: KafkaMessage, offset: int, task: InferenceTask) -> bool:
        """Hold-key ordering: send the request to wait behind an earlier one of its key."""
        assert self._holds is not None  # noqa: S101 - called only then
        key = msg.key() or (task.request.get("routing_key") or task.request_id).encode()
        hold = self._holds.blocking(key, task.request_id)
        if hold is None:
            return False
        self._holds.held(key, task.request_id)
        # Due with the request it waits behind; one that comes back while that one is still
        # being computed waits a little longer rather than circling at once.
        due = max(hold.retry_at_ms, int(time.time() * 1000) + _REHOLD_MS)
        self._failures.hold(self._sink, self.tracker, msg, offset, task, hold.level, due)
        self.tracker.done(offset)
        return True


def hand_over(
    slots: Sequence[Slot], outcome: Sequence[ResultRecord] | BaseException, *, worker_id: str
) -> None:
    """A batch finished: each slot gets its result (or, when the batch failed as a whole, the
    error), then every partition it touched passes its ready prefix to the sink. The caller
    flushes the sink once afterwards. Slots of a partition closed meanwhile are dropped."""
    if isinstance(outcome, BaseException):
        outcome = [error_result(slot.task, outcome, worker_id=worker_id) for slot in slots]
    touched: dict[int, PartitionPipeline] = {}
    for slot, result in zip(slots, outcome, strict=True):
        pipeline = slot.pipeline
        if not pipeline.closed:
            slot.result = result
            touched[id(pipeline)] = pipeline
    for pipeline in touched.values():
        pipeline.answered()
