"""The worker's producers: one for results, replies and dead letters, made transactional under
exactly-once, where a second, plain one carries the side records no transaction should hold."""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import Producer

from tidegate.agents.kafka_io.delivery import ResultPublisher
from tidegate.core.kafka import make_producer
from tidegate.core.settings import KafkaSettings

__all__ = ["Transactions", "start_publisher", "worker_producer"]


@dataclass(frozen=True, slots=True)
class Transactions:
    """Exactly-once: the producer's `transactional.id` and its transaction timeout."""

    transactional_id: str
    timeout_ms: int


def worker_producer(
    kafka: KafkaSettings, client_id: str, transactions: Transactions | None
) -> Producer:
    extra: dict[str, str | int] = {"client.id": client_id}
    if transactions is not None:
        extra["transactional.id"] = transactions.transactional_id
        extra["transaction.timeout.ms"] = transactions.timeout_ms
    return make_producer(kafka, extra)


def start_publisher(publisher: ResultPublisher, kafka: KafkaSettings, transactional: bool) -> None:
    """Start `publisher` (blocking: run it off the loop)."""
    publisher.start()
    if transactional:
        # Fences an earlier process with the same transactional.id and aborts what it left
        # open, so its partitions' readers need not wait for the transaction timeout.
        publisher.producer.init_transactions(30.0)
        publisher.side = make_producer(kafka, {"client.id": f"{kafka.client_id}-side"})
