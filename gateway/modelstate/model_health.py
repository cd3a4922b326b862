"""Which model versions the workers' circuit breakers refuse (`ModelHealth`), replayed from the
breaker-state topic. A version is open here only while every worker that reported on it has it
open and its open period is not over, so the gateway never shuts out a version a worker would try.
How it is read and used: docs/breakers.md ("Where the states go", "At the gateway").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any, Protocol

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from tidegate.core.errors import TidegateError
from tidegate.core.kafka import consume_ready, make_reader
from tidegate.core.settings import KafkaSettings, TopicSettings
from tidegate.core.telemetry import get_logger
from tidegate.schemas.catalog import BREAKER_STATE, load_schema
from tidegate.schemas.codec import AvroDecoder, Registry, registry_client

__all__ = ["CLOSED", "HALF_OPEN", "OPEN", "BreakerStates", "ModelHealth", "version_state"]

_log = get_logger(__name__)
_RETRY_S = 1.0

OPEN, HALF_OPEN, CLOSED = "open", "half_open", "closed"


def _ms(value: Any) -> float:
    """A timestamp-millis field as decoded (a datetime), or as written (ms), or None (0)."""
    if isinstance(value, datetime):
        return value.timestamp() * 1000.0
    return float(value or 0)


def version_state(records: Iterable[Mapping[str, Any]], now_ms: float) -> str:
    """One version's state from its workers' latest records: `open` when every one is open
    and not yet due to probe, `half_open` when some are open or probing, else `closed`."""
    states = [
        HALF_OPEN if r["state"] == OPEN and _ms(r.get("open_until")) <= now_ms else str(r["state"])
        for r in records
    ]
    if not states:
        return CLOSED
    if all(s == OPEN for s in states):
        return OPEN
    return HALF_OPEN if any(s in (OPEN, HALF_OPEN) for s in states) else CLOSED


class BreakerStates(Protocol):
    """What `tidegate.gateway.v2api.infer` asks of the workers' breakers, on every call."""

    def suspect(self, model: str) -> bool:
        """Whether `refusing` may answer anything but None for `model` (O(1))."""

    def refusing(self, model: str, versions: Iterable[str]) -> float | None:
        """Seconds until one of `versions` takes calls again, when every one is open; else None."""


class ModelHealth:
    """`start` it, read it from any thread, `stop` it."""

    def __init__(
        self,
        kafka: KafkaSettings,
        topics: TopicSettings,
        registry: Registry,
        *,
        name: str = "gateway",
        clock: Callable[[], float] = time.time,
        poll_s: float = 0.2,
    ) -> None:
        client = registry_client(registry)
        self.topic = topics.breakers
        self.name = name
        self._kafka = kafka
        self._decode = AvroDecoder(client, load_schema(BREAKER_STATE))
        self._clock = clock
        self._poll_s = poll_s
        # (model, version) -> worker id -> its latest record; replaced whole, read without a lock.
        self._records: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
        # Models with a version some worker reported open, and when the last such open period
        # ends (ms): only they are worth a closer look, and only until then (a worker killed
        # with its breaker open leaves its record behind).
        self._suspects: dict[str, float] = {}
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError(f"model health reader {self.name} already started")
        self._thread = threading.Thread(
            target=self._run, name=f"model-health-{self.name}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()

    def suspect(self, model: str) -> bool:
        """Whether some worker reported a version of `model` open (O(1), for every call): only
        then can `all_open` hold."""
        return self._suspects.get(model, 0.0) > self._clock() * 1000

    def state(self, model: str, version: str) -> str:
        workers = self._records.get((model, version), {})
        return version_state(workers.values(), self._clock() * 1000)

    def open_versions(self, model: str) -> frozenset[str]:
        """The model's versions every reporting worker refuses now."""
        return frozenset(
            v for (m, v) in list(self._records) if m == model and self.state(m, v) == OPEN
        )

    def all_open(self, model: str, versions: Iterable[str]) -> bool:
        """Whether every one of `versions` (the servable ones) is open: then no worker would
        call any of them, and the gateway may answer at once."""
        wanted = list(versions)
        return bool(wanted) and all(self.state(model, v) == OPEN for v in wanted)

    def refusing(self, model: str, versions: Iterable[str]) -> float | None:
        wanted = list(versions)
        return self.retry_after_s(model, wanted) if self.all_open(model, wanted) else None

    def retry_after_s(self, model: str, versions: Iterable[str]) -> float:
        """Seconds until the first of `versions` lets probes through (0 when one does now)."""
        now_ms = self._clock() * 1000
        ends = [
            _ms(r.get("open_until"))
            for v in versions
            for r in self._records.get((model, v), {}).values()
        ]
        return max(0.0, (min(ends, default=now_ms) - now_ms) / 1000)

    # -- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        consumer = make_reader(self._kafka, f"model-health-{self.name}")
        try:
            assigned = False
            while not self._stopping.is_set():
                try:
                    if not assigned:
                        assigned = self._assign(consumer)
                        if not assigned:
                            self._stopping.wait(_RETRY_S)
                            continue
                    for msg in consume_ready(consumer, 500, self._poll_s):
                        error = msg.error()
                        if error is None:
                            self._apply(msg.key(), msg.value())
                        elif error.code() != KafkaError._PARTITION_EOF:
                            _log.warning("model health %s: %s", self.name, error)
                except KafkaException as exc:
                    _log.warning("model health %s: %s", self.name, exc)
                    self._stopping.wait(_RETRY_S)
        finally:
            consumer.close()

    def _assign(self, consumer: Any) -> bool:
        meta = consumer.list_topics(self.topic, timeout=10.0).topics.get(self.topic)
        if meta is None or meta.error is not None or not meta.partitions:
            return False
        consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in meta.partitions])
        return True

    def _apply(self, key: bytes | None, value: bytes | None) -> None:
        if key is None:
            return
        parts = key.decode(errors="replace").split("/", 2)
        if len(parts) != 3:
            return
        model, version, worker = parts
        workers = dict(self._records.get((model, version), {}))
        if value is None:
            workers.pop(worker, None)  # the worker stopped
        else:
            try:
                workers[worker] = dict(self._decode(value))
            except TidegateError as exc:  # one bad record must not stop the reader
                _log.warning("model health %s: unreadable record of %s: %s", self.name, key, exc)
                return
        records = dict(self._records)
        records[(model, version)] = workers
        self._records = records
        suspects: dict[str, float] = {}
        for (m, _), found in records.items():
            for r in found.values():
                if r["state"] == OPEN:
                    suspects[m] = max(suspects.get(m, 0.0), _ms(r.get("open_until")))
        self._suspects = suspects
