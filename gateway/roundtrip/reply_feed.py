"""The Kafka side of replies (`KafkaReplyFeed`): this replica's leased partition of the replies
topic, `assign`ed (no group), read in a thread and handed to the event loop once per batch read,
each reply with the nonce of the submission it answers.
Where it starts reading and why: docs/decisions/003-gateway-replies.md ("Decision");
docs/gateway-hardening.md ("A gateway process that dies is started again").
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition
from opentelemetry.context import Context
from redis.exceptions import RedisError

from tidegate.core.aio import cancel_and_wait
from tidegate.core.errors import ConfigurationError, SerializationError
from tidegate.core.kafka import consume_ready, make_consumer
from tidegate.core.settings import KafkaSettings
from tidegate.core.tracing import context_from_headers
from tidegate.gateway.roundtrip.lease import PartitionLease
from tidegate.gateway.roundtrip.reply_router import Deliver, ReplyFeed
from tidegate.schemas.records import ReplyToRecord, ResultRecord
from tidegate.schemas.requests import SUBMISSION_HEADER

__all__ = ["KafkaReplyFeed"]

_log = logging.getLogger(__name__)
_BATCH = 256
# Replies read again on taking a partition over, at most: older ones are left to the results topic.
_CATCH_UP_MAX = 100_000


ArrivedReply = tuple[ResultRecord, bytes, Context | None, str | None]
"""A reply as read from the partition, before the loop hands it to its call: the result, the
framed bytes it was decoded from (what the result store keeps), its message's trace context (when
tracing is on) and the submission it answers (its `SUBMISSION_HEADER`). A plain tuple: one is
built per reply, and a NamedTuple costs about 6x as much to build."""


class KafkaReplyFeed(ReplyFeed):
    def __init__(
        self,
        kafka: KafkaSettings,
        topic: str,
        lease: PartitionLease,
        decode: Callable[[bytes], ResultRecord],
        *,
        renew_every_s: float,
        group_id: str = "tidegate-gateway",
        timeout_s: float = 10.0,
        traced: bool = False,
    ) -> None:
        self._kafka = kafka
        self._traced = traced
        self._topic = topic
        self._lease = lease
        self._decode = decode
        self._renew_every_s = renew_every_s
        self._group_id = group_id
        self._timeout_s = timeout_s
        self._partitions = 0
        self._want: int | None = None
        self._assigned: int | None = None
        # Where the wanted partition's last holder stopped reading, if it said; the next offset
        # this replica will read of the assigned one (written by the consumer thread).
        self._resume: int | None = None
        self._read: int | None = None
        # The first partition and offset, found before the thread starts.
        self._first: tuple[int, int] | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._renewer: asyncio.Task[None] | None = None

    def reply_to(self) -> ReplyToRecord | None:
        assigned = self._assigned
        alive = self._thread is not None and self._thread.is_alive()
        if (
            alive
            and self._lease.held
            and assigned is not None
            and assigned == self._lease.partition
        ):
            return {"topic": self._topic, "partition": assigned}
        return None

    async def start(self, deliver: Deliver) -> None:
        loop = asyncio.get_running_loop()
        consumer = make_consumer(self._kafka, self._group_id, {"enable.partition.eof": False})
        try:
            self._partitions = await asyncio.to_thread(self._count_partitions, consumer)
        except BaseException:
            consumer.close()
            raise
        await self._claim()
        if self._want is not None:
            # Where reading starts is recorded before the replica reports ready: a process that
            # dies a moment later leaves its successor a place to read on from.
            want = self._want
            try:
                start = await asyncio.to_thread(self._start_offset, consumer, want)
                await self._lease.remember(start)
            except (KafkaException, RedisError) as exc:
                _log.warning(
                    "could not record where %s[%s] is read from: %s", self._topic, want, exc
                )
            else:
                self._first = (want, start)
        self._thread = threading.Thread(
            target=self._run, args=(consumer, loop, deliver), name="gateway-replies", daemon=True
        )
        self._thread.start()
        self._renewer = loop.create_task(self._renew_forever())

    async def stop(self) -> None:
        if self._renewer is not None:
            await cancel_and_wait([self._renewer])
        self._stopping.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        try:
            await self._lease.release()
        except RedisError as exc:
            _log.warning("could not release the reply lease: %s", exc)

    def _count_partitions(self, consumer: Consumer) -> int:
        meta = consumer.list_topics(self._topic, timeout=self._timeout_s).topics.get(self._topic)
        if meta is None or meta.error is not None or not meta.partitions:
            raise ConfigurationError(f"replies topic {self._topic!r} does not exist")
        return len(meta.partitions)

    async def _claim(self) -> None:
        try:
            if self._lease.partition is None or not await self._lease.renew():
                await self._lease.acquire(self._partitions)
        except RedisError as exc:
            # Keep reading the partition we have: replies may still arrive for calls waiting.
            self._lease.held = False
            _log.warning("reply lease not renewed, replica not ready: %s", exc)
            return
        if not self._lease.held:
            _log.warning("no free partition of %s: replica not ready", self._topic)
        want = self._lease.partition if self._lease.held else None
        if want is not None and want != self._want:
            try:
                self._resume = await self._lease.position(want)
            except RedisError as exc:
                _log.warning("could not read where %s[%s] was left: %s", self._topic, want, exc)
                self._resume = None
        self._want = want

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self._renew_every_s)
            await self._claim()
            read = self._read
            if read is not None and self._assigned == self._lease.partition:
                try:
                    await self._lease.remember(read)
                except RedisError as exc:
                    _log.warning("could not record the replies read: %s", exc)

    def _assign(self, consumer: Consumer, partition: int | None) -> bool:
        try:
            if partition is None:
                consumer.unassign()
            else:
                first, self._first = self._first, None
                start = first[1] if first and first[0] == partition else None
                if start is None:
                    start = self._start_offset(consumer, partition)
                consumer.assign([TopicPartition(self._topic, partition, start)])
                self._read = start
        except KafkaException as exc:
            _log.warning("could not assign %s[%s]: %s", self._topic, partition, exc)
            return False
        self._assigned = partition
        _log.info("reading replies from %s[%s]", self._topic, partition)
        return True

    def _start_offset(self, consumer: Consumer, partition: int) -> int:
        """The partition's end, or where its last holder stopped reading, if that is later
        than the oldest reply kept and fewer than `_CATCH_UP_MAX` replies ago."""
        tp = TopicPartition(self._topic, partition)
        low, high = consumer.get_watermark_offsets(tp, timeout=self._timeout_s)
        resume = self._resume
        if resume is not None and max(low, high - _CATCH_UP_MAX) <= resume < high:
            _log.info(
                "%d replies came to %s[%s] while nobody read it: reading them",
                high - resume,
                self._topic,
                partition,
            )
            return int(resume)
        return int(high)

    def _run(self, consumer: Consumer, loop: asyncio.AbstractEventLoop, deliver: Deliver) -> None:
        try:
            while not self._stopping.is_set():
                want = self._want
                if want != self._assigned and not self._assign(consumer, want):
                    self._stopping.wait(0.5)
                    continue
                if self._assigned is None:
                    self._stopping.wait(0.1)
                    continue
                replies = self._decoded(consume_ready(consumer, _BATCH, 0.1))
                if replies:
                    loop.call_soon_threadsafe(_deliver_all, deliver, replies)
        finally:
            self._assigned = None
            consumer.close()

    def _decoded(self, messages: list[Message]) -> list[ArrivedReply]:
        replies: list[ArrivedReply] = []
        traced = self._traced
        last = messages[-1].offset() if messages and messages[-1].error() is None else None
        if last is not None:
            self._read = last + 1
        for msg in messages:
            if msg.error() is not None:
                _log.warning("replies consumer: %s", msg.error())
                continue
            raw = msg.value()
            if raw is None:
                continue
            try:
                result = self._decode(raw)
            except SerializationError as exc:
                _log.warning("undecodable reply at offset %s: %s", msg.offset(), exc)
                continue
            headers = msg.headers()
            trace = context_from_headers(headers) if traced else None
            replies.append((result, raw, trace, _submission(headers)))
        return replies


def _submission(headers: Any) -> str | None:
    """The nonce of the submission a reply answers, from its `SUBMISSION_HEADER` (a consumed
    message's headers are a list of name, bytes pairs, or None)."""
    for name, value in headers or ():
        if name == SUBMISSION_HEADER and isinstance(value, bytes):
            return value.decode("ascii", "replace")
    return None


def _deliver_all(deliver: Deliver, replies: list[ArrivedReply]) -> None:
    for result, raw, trace, nonce in replies:
        # One bad reply must not cost its batch-mates their callers.
        try:
            deliver(result, raw, trace, nonce)
        except Exception:
            _log.exception("could not deliver the reply to %s", result["request_id"])
