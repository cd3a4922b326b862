"""What the worker's consumer thread does between two batches: seek, commit, pause or resume,
refresh the lag gauge and the group metadata, then poll.

Everything here runs on the one thread that owns the consumer, since librdkafka runs rebalance
callbacks on the thread that polls.
"""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from tidegate.agents import worker_metrics as metrics
from tidegate.core.kafka import consume_ready
from tidegate.core.telemetry import get_logger

__all__ = ["ConsumerCycle", "highest_offsets"]

log = get_logger(__name__)

_LAG_EVERY_S = 5.0
# Exactly-once: how often the group metadata sent with each transaction is read again; a
# rebalance makes it stale at once (`stale_metadata`).
_METADATA_EVERY_S = 1.0


class ConsumerCycle:
    def __init__(
        self,
        consumer: Consumer,
        *,
        poll_timeout_s: float,
        group_metadata: bool,
        fetch_window_s: float = 0.0,
        fetch_idle_s: float | None = None,
    ) -> None:
        self.consumer = consumer
        self.paused = False
        # The consumer's group metadata, for exactly-once commits. Asked for from another
        # thread during a rebalance callback, librdkafka blocks until the callback returns,
        # which may itself wait for that commit: so it is read here, between polls.
        self.group_metadata: Any = None
        self._want_metadata = group_metadata
        self._poll_timeout = poll_timeout_s
        self._window = fetch_window_s
        self._idle = fetch_idle_s
        self._lag_at = 0.0
        self._metadata_at = 0.0
        self._handed = 0.0  # when the last batch went to the worker

    def stale_metadata(self) -> None:
        self._metadata_at = 0.0

    def run(
        self, commits: list[TopicPartition], pause: bool, rewind: list[TopicPartition], room: int
    ) -> list[Message]:
        consumer = self.consumer
        for position in rewind:
            try:
                consumer.seek(position)
            except KafkaException as exc:
                log.warning("cannot seek back to %s: %s", position, exc)
        if commits:
            try:
                consumer.commit(offsets=commits, asynchronous=True)
            except KafkaException as exc:
                log.warning("commit failed, the next one covers it: %s", exc)
        if pause or self.paused:
            assignment = consumer.assignment()
            if pause and assignment:
                consumer.pause(assignment)
            elif not pause and assignment:
                consumer.resume(assignment)
            self.paused = pause
        now = time.monotonic()
        if now - self._lag_at >= _LAG_EVERY_S:
            self._lag_at = now
            self._refresh_lag()
        batch = consume_ready(
            consumer, room, self._poll_timeout, self._window, self._idle, since=self._handed
        )
        # After the poll: a rebalance it ran is already in the generation read here.
        if self._want_metadata and time.monotonic() - self._metadata_at >= _METADATA_EVERY_S:
            self._metadata_at = time.monotonic()
            self.group_metadata = consumer.consumer_group_metadata()
        self._handed = time.monotonic()
        return batch

    def close(self, commits: list[TopicPartition]) -> None:
        if commits:
            try:
                self.consumer.commit(offsets=commits, asynchronous=False)
            except KafkaException as exc:
                log.warning("final commit failed: %s", exc)
        self.consumer.close()

    def _refresh_lag(self) -> None:
        consumer = self.consumer
        try:
            positions = consumer.position(consumer.assignment())
        except KafkaException:
            return
        for tp in positions:
            _, high = consumer.get_watermark_offsets(tp, cached=True)
            if tp.offset >= 0 and high >= 0:
                metrics.CONSUMER_LAG.labels(tp.topic, str(tp.partition)).set(high - tp.offset)


def highest_offsets(batch: list[Message]) -> dict[int, int]:
    """The highest offset per partition of a poll's messages."""
    highest: dict[int, int] = {}
    for msg in batch:
        partition, offset = msg.partition(), msg.offset()
        if partition is not None and offset is not None and offset > highest.get(partition, -1):
            highest[partition] = offset
    return highest
