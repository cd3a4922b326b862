"""The registry log on a compacted Kafka topic, designed like Confluent's KafkaStore.

One reader thread consumes the single partition from the beginning and applies every record. The
log is ready once the reader has reached the end offset seen at start. A write produces the record
(idempotent, acks=all), takes its offset from the delivery report and returns only once the reader
has applied that offset, so the state a caller sees after a write is exactly what a restart
rebuilds. Callers serialise writes (`SchemaRegistry` holds a lock), which keeps id and version
allocation free of races within the process. Unlike Confluent there is no leader election: run one
registry process per topic.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # NewTopic is not re-exported
    ConfigResource,
    NewTopic,
    ResourceType,
)

from tidegate.core.errors import ConfigurationError, RegistryUnavailableError
from tidegate.core.kafka import make_admin, make_consumer, make_producer
from tidegate.core.settings import KafkaSettings, RegistryServerSettings
from tidegate.schemas.registry.log import SchemaLog
from tidegate.schemas.registry.topic_records import Record, encode_record

__all__ = ["KafkaLog"]

_log = logging.getLogger(__name__)


class KafkaLog(SchemaLog):
    def __init__(
        self,
        kafka: KafkaSettings,
        settings: RegistryServerSettings,
        *,
        replication_factor: int = 1,
    ) -> None:
        super().__init__()
        self._kafka = kafka
        self._topic = settings.topic
        self._startup_timeout = settings.startup_timeout_s
        self._write_timeout = settings.write_timeout_s
        self._replication_factor = replication_factor
        self._applied = 0  # offset after the last record applied
        self._produced = -1  # offset of the last record this process wrote
        self._end_at_start = 0
        self._progress = threading.Condition()
        self._ready = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer: Any = None
        self._producer: Any = None

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def describe(self) -> str:
        return f"Kafka topic '{self._topic}' at {self._kafka.bootstrap_servers}"

    def start(self) -> None:
        deadline = time.monotonic() + self._startup_timeout
        self._ensure_topic(deadline)
        consumer = make_consumer(
            self._kafka,
            f"tidegate-registry-{uuid.uuid4().hex[:12]}",  # never commits: assign() only
            {"enable.partition.eof": True},
        )
        try:
            low, high = self._end_offsets(consumer, deadline)
        except RegistryUnavailableError:
            consumer.close()
            raise
        self._end_at_start = high
        if high <= low:
            self._ready.set()
        consumer.assign([TopicPartition(self._topic, 0, OFFSET_BEGINNING)])
        self._consumer = consumer
        self._producer = make_producer(self._kafka)
        self._thread = threading.Thread(target=self._read, name="registry-log-reader", daemon=True)
        self._thread.start()
        _log.info("reading registry state from %s up to offset %d", self.describe(), high)

    def wait_ready(self, timeout: float) -> bool:
        return self._ready.wait(timeout)

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        # librdkafka handles are not safe to close while the reader still polls them.
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        if self._producer is not None:
            self._producer.flush(5)
            self._producer = None
        self._ready.clear()
        _log.info("registry log closed")

    def settle(self) -> None:
        # A write that timed out may still land later. Waiting here for every earlier write to be
        # acknowledged and applied keeps the next id and version allocation from colliding with it.
        self.ensure_ready()
        deadline = time.monotonic() + self._write_timeout
        if self._producer.flush(self._write_timeout) > 0:
            raise RegistryUnavailableError(
                f"an earlier write to {self.describe()} is still not acknowledged"
            )
        with self._progress:
            produced = self._produced
        self._wait_applied(produced, deadline)

    def append(self, record: Record) -> None:
        self.ensure_ready()
        key, value = encode_record(record)
        report: dict[str, Any] = {}
        delivered = threading.Event()

        def on_delivery(err: Any, msg: Any) -> None:
            report["error"], report["offset"] = err, msg.offset() if msg is not None else None
            if err is None:
                with self._progress:
                    self._produced = max(self._produced, msg.offset())
            delivered.set()

        deadline = time.monotonic() + self._write_timeout
        try:
            self._producer.produce(
                self._topic, key=key, value=value, partition=0, on_delivery=on_delivery
            )
        except (BufferError, KafkaException) as exc:
            raise RegistryUnavailableError(f"cannot write to {self.describe()}: {exc}") from None
        while not delivered.is_set():
            if time.monotonic() >= deadline:
                raise RegistryUnavailableError(
                    f"Kafka did not acknowledge the write to {self.describe()} "
                    f"within {self._write_timeout}s"
                )
            self._producer.poll(0.05)
        if report["error"] is not None:
            raise RegistryUnavailableError(f"Kafka refused the write: {report['error']}")
        self._wait_applied(int(report["offset"]), deadline)

    def _wait_applied(self, offset: int, deadline: float) -> None:
        with self._progress:
            caught_up = self._progress.wait_for(
                lambda: self._applied > offset, timeout=max(0.0, deadline - time.monotonic())
            )
        if not caught_up:
            raise RegistryUnavailableError(
                f"a write reached {self.describe()} but was not read back "
                f"within {self._write_timeout}s"
            )

    def _read(self) -> None:
        while not self._stopping.is_set():
            try:
                msg = self._consumer.poll(0.2)
            except KafkaException as exc:
                _log.error("registry log reader: %s", exc)
                continue
            if msg is None:
                continue
            error = msg.error()
            if error is None:
                try:
                    self._apply_bytes(msg.key(), msg.value())
                except Exception:  # a dead reader would silently stall every write
                    _log.exception("registry log reader: record at offset %d", msg.offset())
                self._advance(msg.offset() + 1)
            elif error.code() == KafkaError._PARTITION_EOF:
                # At the end of a compacted log the last offsets may hold nothing to apply.
                self._advance(msg.offset())
            else:
                _log.warning("registry log reader: %s", error)

    def _advance(self, next_offset: int) -> None:
        with self._progress:
            self._applied = max(self._applied, next_offset)
            self._progress.notify_all()
        if not self._ready.is_set() and self._applied >= self._end_at_start:
            _log.info("registry state loaded from %s", self.describe())
            self._ready.set()

    def _ensure_topic(self, deadline: float) -> None:
        """Create the topic (1 partition, compacted) or check that the existing one is such."""
        admin = make_admin(self._kafka)
        timeout = max(1.0, deadline - time.monotonic())
        topic = NewTopic(
            self._topic,
            num_partitions=1,
            replication_factor=self._replication_factor,
            config={"cleanup.policy": "compact"},
        )
        # Create first rather than look first: a metadata lookup of a missing topic can make a
        # broker with auto.create.topics.enable create it with the default (delete) policy.
        try:
            admin.create_topics([topic], request_timeout=timeout)[self._topic].result(timeout)
            _log.info("created compacted registry topic '%s'", self._topic)
            return
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise RegistryUnavailableError(
                    f"cannot create registry topic '{self._topic}' at "
                    f"{self._kafka.bootstrap_servers}: {exc.args[0].str()}"
                ) from None
        try:
            found = admin.list_topics(topic=self._topic, timeout=timeout).topics[self._topic]
            resource = ConfigResource(ResourceType.TOPIC, self._topic)
            configs = admin.describe_configs([resource])[resource].result(timeout)
        except KafkaException as exc:
            raise RegistryUnavailableError(f"cannot inspect {self.describe()}: {exc}") from None
        policy = configs["cleanup.policy"].value
        # Like Confluent's KafkaStore: more partitions would lose the order of writes, and a
        # deleting policy would lose schemas.
        if len(found.partitions) != 1 or "compact" not in policy or "delete" in policy:
            raise ConfigurationError(
                f"registry topic '{self._topic}' has {len(found.partitions)} partitions and "
                f"cleanup.policy={policy}; it needs exactly 1 partition and cleanup.policy=compact"
            )

    def _end_offsets(self, consumer: Any, deadline: float) -> tuple[int, int]:
        partition = TopicPartition(self._topic, 0)
        while True:
            try:
                low, high = consumer.get_watermark_offsets(partition, timeout=5.0, cached=False)
                return int(low), int(high)
            except KafkaException as exc:
                # A topic created a moment ago may not be in the metadata yet.
                if time.monotonic() >= deadline:
                    raise RegistryUnavailableError(
                        f"cannot read the end offset of {self.describe()}: {exc}"
                    ) from None
                time.sleep(0.2)
