"""How far a redrive run has got, kept where any host can read it back: as the committed
offsets of a consumer group of the run's own, `tidegate-redrive-<run id>`.

Why Kafka's own offsets: a redrive may run from an operator's laptop (`tidegate dlq redrive`) or
from a gateway replica (`POST /admin/dlq/redrive`), and either may die half-way; the offsets live
next to the data, need no file or table, and the group is never joined (the reader `assign`s
partitions; a commit by an assigned consumer is a plain write of offsets). No other group is
touched, and the group expires with Kafka's `offsets.retention.minutes` (7 days by default).

The committed offset of a partition is the first letter that is not done yet: every letter
before it was either redriven (Kafka acknowledged the republished request) or deliberately
passed over (filtered out, or not an envelope). A letter whose produce failed is not done, so a
resume reads it again; the letters after it that were redriven are redriven again too: a
resume is at-least-once, never at-most-once. Each commit carries a fingerprint of the run's
source and filters; resuming with other filters is refused, since the offsets would skip letters
the new filters select.
"""

from __future__ import annotations

import hashlib
import json
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from tidegate.core.errors import InvalidInputError
from tidegate.dlq.inspect import DeadLetterUnavailableError

__all__ = ["Checkpoint", "fingerprint", "group_for", "load_checkpoint", "save_checkpoint"]


def group_for(run_id: str) -> str:
    return f"tidegate-redrive-{run_id}"


def fingerprint(source: str, selection: Mapping[str, Any]) -> str:
    text = json.dumps({"source": source, "filter": selection}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class Checkpoint:
    """The done-ness of the letters of one topic that a run has read, per partition."""

    def __init__(self, topic: str, print_: str) -> None:
        self.topic = topic
        self.fingerprint = print_
        self._pending: dict[int, deque[int]] = {}
        self._finished: dict[int, set[int]] = {}
        self._next: dict[int, int] = {}
        self._saved: dict[int, int] = {}

    def start(self, partition: int, offset: int) -> None:
        """Where this run starts reading `partition`: nothing before it is this run's."""
        self._next.setdefault(partition, offset)

    def read(self, partition: int, offset: int) -> None:
        self._pending.setdefault(partition, deque()).append(offset)
        self._next.setdefault(partition, offset)

    def done(self, partition: int, offset: int) -> None:
        finished = self._finished.setdefault(partition, set())
        finished.add(offset)
        pending = self._pending.get(partition)
        while pending and pending[0] in finished:
            head = pending.popleft()
            finished.discard(head)
            self._next[partition] = head + 1

    def positions(self) -> dict[int, int]:
        """Per partition read, the first offset not done yet."""
        out = dict(self._next)
        for partition, pending in self._pending.items():
            if pending:
                out[partition] = pending[0]
        return out

    def unsaved(self) -> list[TopicPartition]:
        now = self.positions()
        return [
            TopicPartition(self.topic, p, offset, metadata=self.fingerprint)
            for p, offset in sorted(now.items())
            if self._saved.get(p) != offset
        ]

    def saved(self, offsets: Iterable[TopicPartition]) -> None:
        for tp in offsets:
            self._saved[tp.partition] = tp.offset


def save_checkpoint(consumer: Consumer, checkpoint: Checkpoint) -> None:
    """Commit what changed since the last save (synchronously)."""
    offsets = checkpoint.unsaved()
    if not offsets:
        return
    try:
        consumer.commit(offsets=offsets, asynchronous=False)
    except KafkaException as exc:
        raise DeadLetterUnavailableError(f"cannot save the redrive checkpoint: {exc}") from exc
    checkpoint.saved(offsets)


def load_checkpoint(
    consumer: Consumer, topic: str, partitions: Iterable[int], print_: str, timeout_s: float
) -> dict[tuple[str, int], int]:
    """The offsets a previous run with this group saved, per partition it saved one for."""
    try:
        committed = consumer.committed(
            [TopicPartition(topic, p) for p in partitions], timeout=timeout_s
        )
    except KafkaException as exc:
        raise DeadLetterUnavailableError(f"cannot read the redrive checkpoint: {exc}") from exc
    starts: dict[tuple[str, int], int] = {}
    for tp in committed:
        if tp.offset < 0:
            continue
        if tp.metadata and tp.metadata != print_:
            raise InvalidInputError(
                "this run id was started with another source topic or other filters: resume it "
                "with the same ones, or start a new run id",
                field="resume",
            )
        starts[(topic, tp.partition)] = tp.offset
    return starts
