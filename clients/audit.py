"""The audit trail's writer: admin actions, authentication failures and key changes to `audit-log`.

Every entry says who (`actor`), what (`action`, `target`), when (`at`), from where (`source`) and
the outcome, as a `dev.tidegate.audit.AuditEvent` in the Confluent wire format under
`{topics.audit}-value`. The schema id is looked up in the registry at `start()` (never registered
from here: `tidegate schemas register` owns that), so a stack without the audit subject fails at
start-up rather than losing entries later.

`record` never blocks and never raises into the request it describes: it enqueues with a delivery
callback and returns. A background thread serves delivery reports while the trail runs, so a
failed delivery is logged and counted (`tidegate_audit_failures_total`) even on a quiet gateway;
`close()` flushes what is queued. An audit trail that could fail a request would let an attacker
turn a broken audit topic into a denial of service, and one that blocked would put a Kafka round
trip on every refused call.

`details` must not carry secrets (tokens, keys, passwords, authorization headers). As a second
line of defence, entries whose name looks like one (`authorization`, `key`, `*_key`, `api_key`,
`token`, `*_token`, `*password*`, `*secret*`, `cookie`) or whose value is an HTTP credential
(`Bearer ...`, `Basic ...`) are dropped, and their names listed under `details["redacted"]`. Names
such as `key_id` or `key_prefix` are kept: they identify a key without revealing it. Values are
capped at 1 KiB, so a caller cannot flood the trail through a detail.
"""

from __future__ import annotations

import re
import socket
import threading
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from confluent_kafka import KafkaError, Message, Producer
from opentelemetry import trace
from prometheus_client import Counter

from tidegate.core.errors import TidegateError
from tidegate.core.kafka import make_producer
from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings
from tidegate.core.telemetry import get_logger
from tidegate.schemas.catalog import AUDIT_EVENT, load_schema
from tidegate.schemas.codec import AvroEncoder, Registry, registry_client

__all__ = [
    "AUDIT_FAILURES",
    "AUDIT_RECORDS",
    "DENIED",
    "FAILURE",
    "SUCCESS",
    "AuditTrail",
    "KafkaAuditTrail",
    "MemoryAuditTrail",
    "build_event",
    "clean_details",
    "local_source",
]

SUCCESS = "success"
DENIED = "denied"
FAILURE = "failure"

AUDIT_RECORDS = Counter(
    "tidegate_audit_records", "Audit entries delivered to the audit topic.", ["service"]
)
AUDIT_FAILURES = Counter(
    "tidegate_audit_failures",
    "Audit entries lost: not encoded, refused by a full queue, or not delivered.",
    ["service", "reason"],
)

_LOG = get_logger(__name__)
# Matched against the name lower-cased, `-` as `_`: `X-Api-Key`, `access_token`, `db_password`.
_SECRET_NAME = re.compile(
    r"(^|_)(api_?)?key$|(^|_)token$|authorization|cookie|password|passwd|secret|credential"
)
# A whole value that is an Authorization header's credential; "basic auth is off" is not one.
_CREDENTIAL_VALUE = re.compile(r"^\s*(bearer|basic)\s+[\w.~+/=-]{8,}\s*$", re.IGNORECASE)
_MAX_VALUE = 1024
_POLL_INTERVAL_S = 0.2


def clean_details(details: Mapping[str, str] | None) -> dict[str, str]:
    """`details` without anything that looks like a secret; dropped names go in `redacted`."""
    kept: dict[str, str] = {}
    dropped: list[str] = []
    for name, value in (details or {}).items():
        norm = name.strip().lower().replace("-", "_")
        text = str(value)
        if _SECRET_NAME.search(norm) or _CREDENTIAL_VALUE.match(text):
            dropped.append(name)
            continue
        kept[name] = text if len(text) <= _MAX_VALUE else text[:_MAX_VALUE] + "..."
    if dropped:
        kept["redacted"] = ",".join(sorted(dropped))
    return kept


def build_event(
    action: str,
    *,
    actor: str,
    outcome: str,
    service: str,
    source: str | None = None,
    target: str | None = None,
    details: Mapping[str, str] | None = None,
    at: datetime | None = None,
) -> dict[str, Any]:
    """One `AuditEvent` record. A `request_id` in `details` moves to its own field; the trace id
    is that of the span current here, so an entry links to the trace of the call it describes."""
    cleaned = clean_details(details)
    request_id = cleaned.pop("request_id", None)
    context = trace.get_current_span().get_span_context()
    return {
        "event_id": uuid.uuid4().hex,
        "at": at or datetime.now(UTC),
        "actor": actor,
        "action": action,
        "outcome": outcome,
        "source": source,
        "target": target,
        "details": cleaned,
        "service": service,
        "request_id": request_id,
        "trace_id": trace.format_trace_id(context.trace_id) if context.is_valid else None,
    }


def local_source() -> str:
    """The `source` of entries made on this machine (the CLI, the controller): its host name."""
    return socket.gethostname()


class AuditTrail(Protocol):
    """What callers need: the gateway and the CLI take any trail, a test an in-memory one."""

    def record(
        self,
        action: str,
        *,
        actor: str,
        outcome: str,
        source: str | None = None,
        target: str | None = None,
        details: Mapping[str, str] | None = None,
    ) -> None: ...


class MemoryAuditTrail:
    """Keeps built entries in `events`: for tests of callers, and where no Kafka is configured."""

    def __init__(self, service: str = "gateway") -> None:
        self.service = service
        self.events: list[dict[str, Any]] = []

    def record(
        self,
        action: str,
        *,
        actor: str,
        outcome: str,
        source: str | None = None,
        target: str | None = None,
        details: Mapping[str, str] | None = None,
    ) -> None:
        self.events.append(
            build_event(
                action,
                actor=actor,
                outcome=outcome,
                service=self.service,
                source=source,
                target=target,
                details=details,
            )
        )


class KafkaAuditTrail:
    """Writes entries to the audit topic. `start()` before `record`, `close()` to flush."""

    def __init__(
        self,
        kafka: KafkaSettings | None = None,
        topics: TopicSettings | None = None,
        registry: Registry | None = None,
        *,
        service: str = "gateway",
        producer_extra: Mapping[str, Any] | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self._kafka = kafka or KafkaSettings()
        self._topic = (topics or TopicSettings()).audit
        self._registry = registry or SchemaRegistrySettings()
        self._service = service
        self._producer_extra = dict(producer_extra or {})
        self._clock = clock or (lambda: datetime.now(UTC))
        self._producer: Producer | None = None
        self._encoder: AvroEncoder | None = None
        self._schema_id = 0
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def service(self) -> str:
        return self._service

    def start(self) -> None:
        """Look the schema id up (raises when the subject is missing), connect, start polling."""
        if self._producer is not None:
            return
        encoder = AvroEncoder(registry_client(self._registry), load_schema(AUDIT_EVENT))
        self._schema_id = encoder.schema_id(f"{self._topic}-value")
        self._encoder = encoder
        self._producer = make_producer(self._kafka, self._producer_extra)
        self._stop.clear()
        self._poller = threading.Thread(
            target=self._poll_loop, args=(self._producer,), name="audit-poll", daemon=True
        )
        self._poller.start()

    def close(self, timeout: float = 10.0) -> int:
        """Stop polling and deliver what is queued, up to `timeout`; returns how many were not."""
        self._stop.set()
        if self._poller is not None:
            self._poller.join()
            self._poller = None
        producer, self._producer = self._producer, None
        if producer is None:
            return 0
        left = int(producer.flush(timeout))
        if left:
            _LOG.error("%d audit entries were not delivered to %s before close", left, self._topic)
            AUDIT_FAILURES.labels(self._service, "undelivered").inc(left)
        return left

    def record(
        self,
        action: str,
        *,
        actor: str,
        outcome: str,
        source: str | None = None,
        target: str | None = None,
        details: Mapping[str, str] | None = None,
    ) -> None:
        """Enqueue one entry; failures are logged and counted, never raised."""
        producer, encoder = self._producer, self._encoder
        if producer is None or encoder is None:
            self._lost("not_started", action, "the audit trail is not started")
            return
        event = build_event(
            action,
            actor=actor,
            outcome=outcome,
            service=self._service,
            source=source,
            target=target,
            details=details,
            at=self._clock(),
        )
        try:
            value = encoder.encode(event, self._schema_id)
        except TidegateError as exc:
            self._lost("encode", action, str(exc))
            return
        try:
            # Stamped with the entry's own time, so a reader's `offsets_for_times` finds it.
            producer.produce(
                self._topic,
                value=value,
                key=actor.encode(),
                timestamp=int(event["at"].timestamp() * 1000),
                on_delivery=self._delivered,
            )
        except BufferError:
            self._lost("queue_full", action, "the producer queue is full")
            return
        except Exception as exc:  # KafkaException: a closed or misconfigured producer
            self._lost("produce", action, str(exc))

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            AUDIT_RECORDS.labels(self._service).inc()
        else:
            self._lost("delivery", msg.topic() or self._topic, err.str())

    def _lost(self, reason: str, what: str, why: str) -> None:
        AUDIT_FAILURES.labels(self._service, reason).inc()
        _LOG.error("audit entry lost (%s, %s): %s", reason, what, why)

    def _poll_loop(self, producer: Producer) -> None:
        # Delivery reports are served here, never on the caller's thread (the gateway's loop).
        while not self._stop.is_set():
            producer.poll(_POLL_INTERVAL_S)
