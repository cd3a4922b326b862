"""The worker's circuit breakers, one per model version, and where their states go.

The board owns the `Breaker`s (created on a version's first call, with its model's policy from
`BreakerSettings`), keeps the Prometheus gauge and transition counter in step, and hands every
transition to `publish`: in a worker, `BreakerPublisher` writes it to the compacted breaker-state
topic that the gateway's `model_health` reads. Publishing is best effort: a breaker works the
same whether or not anyone hears about it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message
from confluent_kafka.schema_registry import SchemaRegistryClient

from tidegate.agents import worker_metrics as metrics
from tidegate.agents.breakers.breaker import Breaker, BreakerState, Transition
from tidegate.agents.breakers.breaker_settings import BreakerSettings
from tidegate.core.errors import TidegateError
from tidegate.core.kafka import make_producer
from tidegate.core.settings import KafkaSettings, TopicSettings
from tidegate.core.telemetry import get_logger
from tidegate.schemas.catalog import BREAKER_STATE, load_schema
from tidegate.schemas.codec import AvroEncoder

__all__ = ["BreakerBoard", "BreakerPublisher", "Publish", "breaker_key"]

log = get_logger(__name__)

Publish = Callable[[str, dict[str, Any] | None], None]
"""(key, BreakerState record, or None for a tombstone)."""

_GAUGE = {BreakerState.CLOSED: 0, BreakerState.HALF_OPEN: 1, BreakerState.OPEN: 2}


def breaker_key(model: str, version: str, worker_id: str) -> str:
    return f"{model}/{version}/{worker_id}"


class BreakerBoard:
    """Used on the worker's event loop only."""

    def __init__(
        self,
        settings: BreakerSettings,
        *,
        worker_id: str,
        publish: Publish | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.worker_id = worker_id
        self._publish = publish
        self._clock = clock
        self._wall = wall
        self._breakers: dict[tuple[str, str], Breaker | None] = {}
        self._published: set[str] = set()

    def _breaker(self, model: str, version: str) -> Breaker | None:
        key = (model, version)
        try:
            return self._breakers[key]
        except KeyError:
            pass
        breaker = None
        if self.settings.is_enabled(model):
            breaker = Breaker(self.settings.policy(model), self._clock)
            metrics.BREAKER_STATE.labels(model, version).set(0)
        self._breakers[key] = breaker
        return breaker

    def admit(self, model: str, version: str, calls: int) -> int:
        """How many of `calls` requests may run on the version now."""
        breaker = self._breaker(model, version)
        if breaker is None:
            return calls
        allowed, moved = breaker.admit(calls)
        if moved is not None:
            self._changed(model, version, breaker, moved)
        if allowed < calls:
            metrics.BREAKER_REFUSED.labels(model, version).inc(calls - allowed)
        return allowed

    def record(self, model: str, version: str, ok: int, failed: int, ignored: int = 0) -> None:
        breaker = self._breaker(model, version)
        if breaker is None:
            return
        moved = breaker.record(ok, failed, ignored)
        if moved is not None:
            self._changed(model, version, breaker, moved)

    def state(self, model: str, version: str) -> BreakerState:
        breaker = self._breakers.get((model, version))
        return breaker.state if breaker is not None else BreakerState.CLOSED

    def reopens_at_ms(self, model: str, version: str) -> int:
        """When an open breaker lets probes through again (wall clock, ms); 0 when not open."""
        breaker = self._breakers.get((model, version))
        if breaker is None or breaker.state is not BreakerState.OPEN:
            return 0
        return int((self._wall() + breaker.snapshot().reopens_in_s) * 1000)

    def close(self) -> None:
        """Tombstone every state this worker published: a stopped worker guards nothing."""
        if self._publish is None:
            return
        for key in sorted(self._published):
            self._publish(key, None)
        self._published.clear()

    def _changed(self, model: str, version: str, breaker: Breaker, moved: Transition) -> None:
        state = moved.after
        metrics.BREAKER_STATE.labels(model, version).set(_GAUGE[state])
        metrics.BREAKER_TRANSITIONS.labels(model, version, state.value).inc()
        snap = breaker.snapshot()
        log_at = log.warning if state is BreakerState.OPEN else log.info
        log_at(
            "breaker of %s version %s: %s -> %s (%s)",
            model,
            version,
            moved.before.value,
            state.value,
            moved.why,
        )
        if self._publish is None:
            return
        now_ms = int(self._wall() * 1000)
        changed_ms, open_until_ms = now_ms, None
        if state is BreakerState.OPEN:
            # The period runs from the trip, a moment before this snapshot: both ends are dated
            # from it, so readers see the whole period, not what was left of it.
            open_until_ms = now_ms + round(snap.reopens_in_s * 1000)
            changed_ms = open_until_ms - round(snap.open_for_s * 1000)
        key = breaker_key(model, version, self.worker_id)
        record = {
            "model": model,
            "version": version,
            "worker_id": self.worker_id,
            "state": state.value,
            "changed_at": changed_ms,
            "open_until": open_until_ms,
            "trips": snap.trips,
            "calls": snap.calls,
            "failures": snap.failures,
            "reason": moved.why,
        }
        self._published.add(key)
        self._publish(key, record)


class BreakerPublisher:
    """Writes breaker states to `topics.breakers` with a producer of its own: transitions are
    rare, and must not wait for (or abort with) the results' transactions."""

    def __init__(
        self, kafka: KafkaSettings, topics: TopicSettings, registry: SchemaRegistryClient
    ) -> None:
        self.topic = topics.breakers
        self._producer = make_producer(kafka, {"linger.ms": 0})
        self._encoder = AvroEncoder(registry, load_schema(BREAKER_STATE))
        self._schema_id: int | None = None

    def prepare(self, timeout_s: float = 5.0) -> bool:
        """Check the topic and look the schema id up (blocking: call it off the event loop,
        before serving). Without either, nothing is published: records for a missing topic
        would only wait out their timeout in the producer's queue, and delay the stop."""
        try:
            found = self._producer.list_topics(self.topic, timeout=timeout_s).topics.get(self.topic)
            if found is None or found.error is not None:
                why = found.error if found is not None else "missing"
                raise TidegateError(f"topic {self.topic!r} is not there: {why}")
            self._schema_id = self._encoder.schema_id(f"{self.topic}-value")
        except (TidegateError, KafkaException) as exc:
            log.warning("breaker states will not be published to %s: %s", self.topic, exc)
            return False
        return True

    def __call__(self, key: str, record: dict[str, Any] | None) -> None:
        if self._schema_id is None:
            return
        try:
            value = None if record is None else self._encoder.encode(record, self._schema_id)
            self._producer.produce(
                self.topic, key=key.encode(), value=value, on_delivery=self._delivered
            )
            self._producer.poll(0)
        except Exception as exc:  # a full queue, a bad record: the breaker goes on regardless
            log.warning("cannot publish the breaker state of %s: %s", key, exc)

    def close(self, timeout_s: float = 2.0) -> None:
        left = self._producer.flush(timeout_s)
        if left:
            log.warning("%d breaker states not delivered at stop", left)

    @staticmethod
    def _delivered(error: KafkaError | None, msg: Message) -> None:
        if error is not None:
            log.warning("a breaker state was not delivered to %s: %s", msg.topic(), error)
