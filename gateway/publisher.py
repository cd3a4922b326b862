"""Publishing requests from the event loop; the broker's acknowledgement comes as a future.

`KafkaPublisher` builds on `tidegate.clients.producer.TidegateProducer`. librdkafka's delivery
reports are served by a small thread that polls the producer; each report settles its future on the
loop with `call_soon_threadsafe`, so the loop never blocks on Kafka.

`submit` encodes and enqueues at once and hands back the acknowledgement as a future, so a caller
can wait for it and for the request's reply together. The record is encoded on the loop: a small
request takes about 20 µs to encode, and a hop to a thread and back costs about 100 µs of CPU
(docs/decisions/009).
"""

from __future__ import annotations

import asyncio
import threading
from abc import ABC, abstractmethod
from typing import Any

from confluent_kafka import KafkaError

from tidegate.clients.producer import PublishError, TidegateProducer
from tidegate.core.errors import ConfigurationError
from tidegate.core.kafka import make_admin
from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings
from tidegate.core.tracing import TRACING_OFF, Tracing

__all__ = ["Ack", "KafkaPublisher", "RequestPublisher"]

Ack = asyncio.Future[None]
"""Done when the broker has the request; failed with `PublishError` when it did not take it."""


class RequestPublisher(ABC):
    @abstractmethod
    def submit(self, record: dict[str, Any]) -> Ack:
        """Enqueue the request now (on the loop); a record that cannot be enqueued raises."""

    async def publish(self, record: dict[str, Any]) -> None:
        """Return once the broker has the request; `PublishError` if it does not take it."""
        await self.submit(record)

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Connect before the first publish."""

    async def stop(self) -> None:  # noqa: B027 - optional hook
        """Deliver what is queued and disconnect."""

    @property
    def connected(self) -> bool:
        return True


class KafkaPublisher(RequestPublisher):
    def __init__(
        self,
        kafka: KafkaSettings,
        topics: TopicSettings,
        registry: SchemaRegistrySettings,
        *,
        connect_timeout_s: float = 15.0,
        tracing: Tracing = TRACING_OFF,
    ) -> None:
        self._kafka = kafka
        self._topics = topics
        self._connect_timeout_s = connect_timeout_s
        # With tracing on, each request is a `send` span under the call's, its context in the
        # request's headers.
        self._producer = TidegateProducer(
            kafka, topics, registry, producer_extra={"error_cb": self._on_error}, tracing=tracing
        )
        self._stopping = threading.Event()
        self._poller: threading.Thread | None = None
        self._connected = False

    @property
    def connected(self) -> bool:
        return self._connected

    def _on_error(self, error: KafkaError) -> None:
        # Called from the polling thread. Only losing every broker changes readiness: other
        # errors are transient and librdkafka retries them itself.
        if error.code() == KafkaError._ALL_BROKERS_DOWN:
            self._connected = False

    async def start(self) -> None:
        await asyncio.to_thread(self._start)
        self._poller = threading.Thread(target=self._poll, name="gateway-publisher", daemon=True)
        self._poller.start()

    def _start(self) -> None:
        self._producer.start(self._connect_timeout_s)
        topic = self._topics.requests
        meta = make_admin(self._kafka).list_topics(topic, timeout=self._connect_timeout_s)
        found = meta.topics.get(topic)
        if found is None or found.error is not None:
            raise ConfigurationError(f"requests topic {topic!r} does not exist")
        self._connected = True

    def _poll(self) -> None:
        while not self._stopping.is_set():
            self._producer.poll(0.05)

    async def stop(self) -> None:
        self._stopping.set()
        if self._poller is not None:
            await asyncio.to_thread(self._poller.join)
        await asyncio.to_thread(self._producer.stop)
        self._connected = False

    def submit(self, record: dict[str, Any]) -> Ack:
        loop = asyncio.get_running_loop()
        acked: Ack = loop.create_future()

        def settle(_request_id: str, error: Exception | None) -> None:
            loop.call_soon_threadsafe(self._resolve, acked, error)

        self._producer.publish_record(record, on_delivery=settle)
        return acked

    def _resolve(self, future: Ack, error: Exception | None) -> None:
        if error is None:
            self._connected = True
        if future.done():
            return
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(
                error if isinstance(error, PublishError) else PublishError(str(error))
            )
