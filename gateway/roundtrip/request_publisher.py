"""Publishing requests from the event loop (`KafkaRequestPublisher`): `submit` holds a request for
the publish window and hands back the broker's acknowledgement as a future. It refuses at once
while no broker is reachable and a lane whose topic is missing; a record over the Kafka limit, or
one that does not encode, fails its own acknowledgement when the window is flushed.
Health and limits: docs/deadlines-and-faults.md ("Kafka down: 503 at once, recovery on its own",
"Large payloads"); why it encodes on the loop: docs/decisions/009-gateway-hot-path.md ("Decision").
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # not re-exported
    AdminClient,
    ConfigResource,
    ResourceType,
)

from tidegate.clients.pool_moves import MoveGuard, Warm
from tidegate.clients.producer import (
    DeliveryCallback,
    Lane,
    Placement,
    PublishError,
    RecordTooLargeError,
    TidegateProducer,
    lane_topic,
)
from tidegate.core.errors import ConfigurationError, TidegateError
from tidegate.core.kafka import make_admin
from tidegate.core.pools import pool_topic_names
from tidegate.core.settings import KafkaSettings, TopicSettings
from tidegate.core.tracing import TRACING_OFF, Tracing
from tidegate.gateway.gateway_settings import GatewaySettings
from tidegate.schemas.codec import Registry
from tidegate.schemas.records import RequestRecord

__all__ = [
    "Ack",
    "Delivery",
    "KafkaRequestPublisher",
    "RequestPublisher",
    "producer_options",
    "record_limit",
]

_log = logging.getLogger(__name__)

Ack = asyncio.Future[None]
"""Done when the broker has the request; failed with `PublishError` when it did not take it."""
Failed = Callable[[Exception], None]

# What librdkafka lingers after a window's flush, so that the requests it enqueues one by one
# leave in one ProduceRequest.
_FLUSH_LINGER_MS = 2.0


class Delivery:
    """A synchronous call's acknowledgement, kept off the event loop: `acked` turns true on the
    producer's thread once the broker has the request, which wakes nothing unless `on_ack` was
    set first (a call whose deadline passed before the ack, then woken by it on the loop); a
    failure reaches the loop through the `on_failure` given to `send`. An Ack future would cost
    the loop a wake-up and two callbacks per call."""

    __slots__ = ("acked", "error", "on_ack")

    def __init__(self) -> None:
        self.acked = False
        self.error: Exception | None = None
        self.on_ack: Callable[[], None] | None = None

    def acknowledged(self, loop: asyncio.AbstractEventLoop) -> None:
        """The broker has it (on any thread). `acked` is written before `on_ack` is read, and a
        waiter sets `on_ack` before it reads `acked` again: one of them sees the other."""
        self.acked = True
        late = self.on_ack
        if late is not None:
            loop.call_soon_threadsafe(late)


# What a one-record batch adds to the record on the broker (batch and record headers), and what
# lz4 may add to incompressible data (1/255 of it): the topic's limit applies to that batch.
_BATCH_OVERHEAD = 1024
_LZ4_GROWTH = 128


def record_limit(max_record_bytes: int, topic_max_message_bytes: int | None) -> int:
    """The largest record to publish: the configured one, or less when the topic takes less."""
    if topic_max_message_bytes is None:
        return max_record_bytes
    fits = topic_max_message_bytes - topic_max_message_bytes // _LZ4_GROWTH - _BATCH_OVERHEAD
    return max(1000, min(max_record_bytes, fits))


def producer_options(settings: GatewaySettings, limit: int) -> dict[str, Any]:
    """The librdkafka options of the gateway's producer, beyond `core.kafka`'s, for records of
    at most `limit` bytes."""
    return {
        "statistics.interval.ms": max(100, round(settings.kafka_probe_s * 1000)),
        # Every publish resolves within the call's budget: acknowledged, or failed and never
        # sent again (`delivery.timeout.ms` is the same option).
        "message.timeout.ms": round(settings.publish_timeout_s * 1000),
        "message.max.bytes": limit,
        "batch.size": limit,
        # librdkafka reconnects with a backoff growing to 10 s: after an outage the gateway
        # would refuse calls that long after the brokers are back.
        "reconnect.backoff.max.ms": 1000,
        # The publish window holds requests for most of `publish_linger_ms` (decision 019):
        # librdkafka lingers only for the enqueueing of one window's requests.
        "linger.ms": min(settings.publish_linger_ms, _FLUSH_LINGER_MS),
    }


class RequestPublisher(ABC):
    @abstractmethod
    def submit(self, record: RequestRecord, lane: Lane = "realtime") -> Ack:
        """Publish the request on `lane` (called on the loop). What is refused before anything is
        held raises; a record that then cannot be enqueued fails the returned future."""

    async def publish(self, record: RequestRecord, lane: Lane = "realtime") -> None:
        """Return once the broker has the request; `PublishError` if it does not take it."""
        await self.submit(record, lane)

    def send(self, record: RequestRecord, lane: Lane, on_failure: Failed) -> Delivery:
        """Enqueue like `submit`, for a caller that only needs to hear of a failure (on the
        loop, through `on_failure`) and may look at `Delivery.acked` later."""
        delivery = Delivery()

        def settled(ack: Ack) -> None:
            if ack.cancelled():
                return
            error = ack.exception()
            if error is None:
                delivery.acknowledged(asyncio.get_running_loop())
            elif isinstance(error, Exception):
                delivery.error = error
                on_failure(error)

        self.submit(record, lane).add_done_callback(settled)
        return delivery

    def check(self) -> None:
        """Raise `PublishError` at once while nothing could be delivered."""
        if not self.connected:
            raise PublishError("no Kafka broker is reachable; the request was not sent")

    async def missing_pool_topics(self, pool: str) -> list[str]:
        """The topics `pool` needs that Kafka does not have: a model placed there before they
        exist could not take a call. A publisher with no topics has none missing."""
        return []

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Connect before the first publish."""

    async def stop(self) -> None:  # noqa: B027 - optional hook
        """Deliver what is queued and disconnect."""

    @property
    def connected(self) -> bool:
        return True


@dataclass(frozen=True, slots=True)
class _Held:
    """A request in the publish window, with what its call hears: the delivery report (on the
    producer's thread) or the refusal to enqueue it (on the loop)."""

    record: RequestRecord
    lane: Lane
    settle: DeliveryCallback
    refused: Failed


class KafkaRequestPublisher(RequestPublisher):
    def __init__(
        self,
        kafka: KafkaSettings,
        topics: TopicSettings,
        registry: Registry,
        *,
        gateway: GatewaySettings | None = None,
        connect_timeout_s: float = 15.0,
        tracing: Tracing = TRACING_OFF,
        placement: Placement | None = None,
        worker_group: str = "tidegate-workers",
        warm: Warm | None = None,
    ) -> None:
        """`placement` names each model's pool, whose requests topic its calls go to; a moving
        model's calls wait for the old pool's workers (`worker_group`) to drain first, and for
        the new pool to have it loaded (`warm`)."""
        self._warm = warm
        self._kafka = kafka
        self._placement = placement
        self._worker_group = worker_group
        self._topics = topics
        self._registry = registry
        self._settings = gateway or GatewaySettings()
        self._connect_timeout_s = connect_timeout_s
        self._tracing = tracing
        self._producer: TidegateProducer | None = None
        self._stopping = threading.Event()
        self._poller: threading.Thread | None = None
        self._connected = False
        self._window_s = self._settings.publish_linger_ms / 1000.0
        self._held: list[_Held] = []
        self._flush_timer: asyncio.TimerHandle | None = None
        # Why a batch-lane call is refused; None while that lane is served.
        self._no_batch: str | None = "the publisher is not started"

    @property
    def connected(self) -> bool:
        return self._connected

    @property
    def move_guard(self) -> MoveGuard | None:
        """What holds a moving model's calls (None before the start)."""
        return self._producer.move_guard if self._producer is not None else None

    def _running(self) -> TidegateProducer:
        if self._producer is None:
            raise ConfigurationError("the gateway's publisher is not started")
        return self._producer

    def _down(self, why: str) -> None:
        if self._connected:
            _log.warning("Kafka is unreachable (%s): calls are refused until it is back", why)
        self._connected = False

    def _on_error(self, error: KafkaError) -> None:
        # Called from the polling thread. Only losing every broker changes readiness: other
        # errors are transient and librdkafka retries them itself.
        if error.code() == KafkaError._ALL_BROKERS_DOWN:
            self._down(error.str())

    def _on_stats(self, raw: str) -> None:
        # Called from the polling thread, every `kafka_probe_s`: any broker connection UP means
        # requests can be delivered again. Losing them is left to `_on_error` and failed
        # deliveries, which come sooner than the next statistics.
        if self._connected:
            return
        brokers = json.loads(raw).get("brokers", {})
        if any(broker.get("state") == "UP" for broker in brokers.values()):
            _log.warning("Kafka is reachable again: calls are accepted")
            self._connected = True

    async def start(self) -> None:
        await asyncio.to_thread(self._start)
        self._poller = threading.Thread(target=self._poll, name="gateway-publisher", daemon=True)
        self._poller.start()

    def _start(self) -> None:
        topic = self._topics.requests
        admin = make_admin(self._kafka)
        meta = admin.list_topics(topic, timeout=self._connect_timeout_s)
        found = meta.topics.get(topic)
        if found is None or found.error is not None:
            raise ConfigurationError(f"requests topic {topic!r} does not exist")
        limit = record_limit(self._settings.max_record_bytes, self._topic_limit(admin, topic))
        extra = {
            "error_cb": self._on_error,
            "stats_cb": self._on_stats,
            **producer_options(self._settings, limit),
        }
        producer = TidegateProducer(
            self._kafka,
            self._topics,
            self._registry,
            producer_extra=extra,
            tracing=self._tracing,
            placement=self._placement,
            worker_group=self._worker_group,
            warm=self._warm,
        )
        producer.start(self._connect_timeout_s)
        self._no_batch = self._batch_lane(admin, producer)
        self._producer = producer
        self._connected = True

    def _batch_lane(self, admin: AdminClient, producer: TidegateProducer) -> str | None:
        """Why the batch lane cannot be served (None when it can); its subject is looked up now,
        so a batch call never waits on the registry."""
        topic = lane_topic(self._topics, "batch")
        meta = admin.list_topics(topic, timeout=self._connect_timeout_s).topics.get(topic)
        try:
            if meta is None or meta.error is not None:
                raise ConfigurationError(f"topic {topic!r} does not exist")
            producer.schema_id("batch")
            producer.partition_count(topic, self._connect_timeout_s)
        except TidegateError as exc:
            _log.warning("batch-lane calls are refused: %s", exc)
            return f"this gateway serves no batch lane: {exc}"
        return None

    def _topic_limit(self, admin: AdminClient, topic: str) -> int | None:
        resource = ConfigResource(ResourceType.TOPIC, topic)
        try:
            configs = admin.describe_configs([resource])[resource].result(self._connect_timeout_s)
        except KafkaException as exc:
            # A principal allowed to write but not to describe: the configured limit stands.
            _log.warning("cannot read max.message.bytes of %s: %s", topic, exc)
            return None
        entry = configs.get("max.message.bytes")
        return int(entry.value) if entry is not None and entry.value else None

    def _poll(self) -> None:
        producer = self._running()
        while not self._stopping.is_set():
            producer.poll(0.05)

    async def stop(self) -> None:
        self._flush()
        self._stopping.set()
        if self._poller is not None:
            await asyncio.to_thread(self._poller.join)
        if self._producer is not None:
            await asyncio.to_thread(self._producer.stop)
        self._connected = False

    async def missing_pool_topics(self, pool: str) -> list[str]:
        names = pool_topic_names(self._topics, pool)
        try:
            return await asyncio.to_thread(self._running().missing_topics, names)
        except KafkaException as exc:
            raise PublishError(f"Kafka did not say which topics it has: {exc}") from exc

    def submit(self, record: RequestRecord, lane: Lane = "realtime") -> Ack:
        self._ready(lane)
        loop = asyncio.get_running_loop()
        acked: Ack = loop.create_future()

        def settle(_request_id: str, error: Exception | None) -> None:
            loop.call_soon_threadsafe(self._resolve, acked, error)

        def refused(error: Exception) -> None:
            if not acked.done():
                acked.set_exception(error)

        self._hold(_Held(record, lane, settle, refused))
        return acked

    def send(self, record: RequestRecord, lane: Lane, on_failure: Failed) -> Delivery:
        self._ready(lane)
        loop = asyncio.get_running_loop()
        delivery = Delivery()

        def settle(_request_id: str, error: Exception | None) -> None:
            # On the producer's thread (or the loop's, from publish_record's own poll): a
            # success is a flag, and only a failure wakes the loop.
            if error is None:
                delivery.acknowledged(loop)
                self._connected = True
            else:
                loop.call_soon_threadsafe(self._failed, delivery, on_failure, error)

        def refused(error: Exception) -> None:
            delivery.error = error
            on_failure(error)

        self._hold(_Held(record, lane, settle, refused))
        return delivery

    def _hold(self, held: _Held) -> None:
        self._held.append(held)
        if self._flush_timer is None:
            self._flush_timer = asyncio.get_running_loop().call_later(self._window_s, self._flush)

    def _flush(self) -> None:
        """Encode and enqueue the window's requests in one pass, in the order they came: run
        back to back, the encoder and the producer's code stay in the CPU's caches, where one
        request every few milliseconds found them cold (docs/benchmarks.md, "The publish
        window")."""
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        held, self._held = self._held, []
        producer = self._producer
        if producer is None:
            for request in held:
                request.refused(PublishError("the gateway's publisher is stopped"))
            return
        for request in held:
            try:
                # The polling thread serves the delivery reports.
                producer.publish_record(
                    request.record, on_delivery=request.settle, lane=request.lane, poll=False
                )
            except Exception as exc:  # one record's refusal (a 413, a 400) is its call's alone
                request.refused(exc)

    def _ready(self, lane: Lane) -> None:
        """Raise now what would refuse a request on `lane`, before it is held."""
        self.check()
        self._running()
        if lane == "batch" and self._no_batch is not None:
            raise PublishError(self._no_batch)

    def _failed(self, delivery: Delivery, on_failure: Failed, error: Exception) -> None:
        self._note(error)
        delivery.error = _publish_error(error)
        on_failure(delivery.error)

    def _note(self, error: Exception | None) -> None:
        if error is None:
            self._connected = True
        elif not isinstance(error, RecordTooLargeError):
            # Timed out, or the brokers refused: the next calls would fare no better until the
            # statistics show a broker back.
            self._down(str(error))

    def _resolve(self, future: Ack, error: Exception | None) -> None:
        self._note(error)
        if future.done():
            return
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(_publish_error(error))


def _publish_error(error: Exception) -> Exception:
    return (
        error if isinstance(error, PublishError | RecordTooLargeError) else PublishError(str(error))
    )
