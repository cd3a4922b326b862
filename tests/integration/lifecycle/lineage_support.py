"""Results and shadow comparisons published as workers publish them, with the subjects they
need: what the lineage tests feed the indexer."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.serialization import MessageField, SerializationContext

from tidegate.core.kafka import make_producer
from tidegate.core.settings import (
    KafkaSettings,
    SchemaRegistrySettings,
    TopicSettings,
)
from tidegate.lifecycle.eventstore.event_codec import ShadowComparisonCodec
from tidegate.schemas.catalog import INFERENCE_RESULT, SHADOW_COMPARISON, load_schema
from tidegate.schemas.codec import AvroEncoder
from tidegate.schemas.registration import RegistryHttp, register_all

__all__ = ["ResultPublisher", "make_result", "register_lineage_subjects"]


def register_lineage_subjects(registry: SchemaRegistrySettings, topics: TopicSettings) -> None:
    subjects = {
        f"{topics.results}-value": INFERENCE_RESULT,
        f"{topics.shadow}-value": SHADOW_COMPARISON,
    }
    with RegistryHttp(registry) as http:
        list(register_all(http, subjects))


def make_result(
    request_id: str,
    *,
    model: str = "fraud",
    version: str | None = "v1",
    status: str = "OK",
    total_ms: float = 5.0,
    worker_id: str = "w1",
    rule: str | None = "split@4",
    completed_at: datetime | None = None,
) -> dict[str, Any]:
    """An InferenceResult record as a worker publishes it."""
    error = None
    if status != "OK":
        error = {
            "code": "MODEL_ERROR",
            "message": "boom",
            "error_class": "ModelExecutionError",
            "retriable": False,
            "field": None,
            "details": {},
        }
    at = completed_at or datetime.now(UTC)
    return {
        "request_id": request_id,
        "model": model,
        "model_version": version,
        "status": status,
        "outputs": [],
        "error": error,
        "timings": {"queue_ms": 0.0, "batch_ms": 0.0, "compute_ms": 1.0, "total_ms": total_ms},
        "batch_size": 1,
        "worker_id": worker_id,
        "source": None,
        "routing_rule": rule,
        "tenant": "acme",
        "routing_key": f"key-{request_id}",
        "completed_at": int(at.timestamp() * 1000),
    }


class ResultPublisher:
    """Publishes encoded records to the results and shadow topics, and waits for delivery."""

    def __init__(
        self, kafka: KafkaSettings, registry: SchemaRegistrySettings, topics: TopicSettings
    ) -> None:
        client = SchemaRegistryClient(registry.client_config())
        self._topics = topics
        self._results = AvroEncoder(client, load_schema(INFERENCE_RESULT))
        self._shadows = ShadowComparisonCodec(client, topics)
        self._producer = make_producer(kafka)

    def results(self, records: Iterable[dict[str, Any]]) -> None:
        ctx = SerializationContext(self._topics.results, MessageField.VALUE)
        for record in records:
            value = self._results(record, ctx)
            self._producer.produce(self._topics.results, key=record["request_id"], value=value)
        assert self._producer.flush(30) == 0

    def shadows(self, records: Iterable[dict[str, Any]]) -> None:
        for record in records:
            value = self._shadows.encode(record)
            self._producer.produce(self._topics.shadow, key=record["model"], value=value)
        assert self._producer.flush(30) == 0
