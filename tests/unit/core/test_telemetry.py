"""Logging: text by default, JSON with trace and request ids, capped lines, summarised repeats, and
librdkafka's lines through Python logging (no servers: a closed port is the Kafka outage)."""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tidegate.core.kafka import make_consumer, make_producer
from tidegate.core.settings import KafkaSettings
from tidegate.core.telemetry import LineCap, RepeatSummary, configure_logging
from tidegate.core.telemetry_settings import TelemetrySettings, TracingSettings
from tidegate.core.tracing import start_tracing


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Logged:
    """`configure_logging`, its handler writing to a buffer instead of stderr."""

    def __init__(self) -> None:
        self.buffer = io.StringIO()

    def configure(self, settings: TelemetrySettings) -> None:
        configure_logging(settings)
        handler = logging.getLogger().handlers[0]
        assert isinstance(handler, logging.StreamHandler)
        handler.setStream(self.buffer)

    def lines(self) -> list[str]:
        return self.buffer.getvalue().splitlines()


@pytest.fixture
def logged() -> Iterator[Logged]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield Logged()
    root.handlers[:] = handlers
    root.setLevel(level)


def record(msg: str, *args: object, level: int = logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord("t", level, __file__, 1, msg, args or None, None)


def test_the_text_format_stays_as_it_was(logged: Logged) -> None:
    logged.configure(TelemetrySettings())
    logging.getLogger("tidegate.x").warning("hello %s", "there")
    line = logged.lines()[0]
    assert line.endswith("WARNING tidegate.x: hello there")
    assert not line.startswith("{")


def test_json_lines_carry_the_current_trace_and_the_request_id(logged: Logged) -> None:
    logged.configure(TelemetrySettings(log_json=True))
    log = logging.getLogger("tidegate.x")
    log.info("outside any span")
    tracing = start_tracing(TracingSettings(enabled=True), "unit", exporter=InMemorySpanExporter())
    assert tracing.tracer is not None
    with tracing.tracer.start_as_current_span("call") as span:
        log.warning("inside %s", "a span", extra={"request_id": "r-1"})
    outside, inside = (json.loads(line) for line in logged.lines())
    assert "trace_id" not in outside
    assert "request_id" not in outside
    context = span.get_span_context()
    assert inside["msg"] == "inside a span"
    assert inside["request_id"] == "r-1"
    assert inside["trace_id"] == f"{context.trace_id:032x}"
    assert inside["span_id"] == f"{context.span_id:016x}"


def test_a_long_message_is_cut_and_says_how_much_was_cut() -> None:
    schema = "{'type': 'record', 'name': 'X', 'fields': [...]}" * 400  # ~20 KB, like fastavro's
    rec = record("poison pill at %s[%d]@%d: %s", "requests", 3, 17, schema)
    assert LineCap(2048).filter(rec)
    message = rec.getMessage()
    full = f"poison pill at requests[3]@17: {schema}"
    assert message.startswith(full[:2048])
    assert message.endswith(f"... ({len(full) - 2048} more bytes)")
    assert len(message.encode()) < 2100


def test_short_messages_and_multibyte_text_are_cut_on_a_character() -> None:
    short = record("fine %s", "as it is")
    assert LineCap(64).filter(short)
    assert short.getMessage() == "fine as it is"
    wide = record("é" * 100)  # 200 bytes
    LineCap(51).filter(wide)
    assert wide.getMessage() == "é" * 25 + "... (150 more bytes)"


def test_each_line_of_a_traceback_is_cut_too(logged: Logged) -> None:
    logged.configure(TelemetrySettings(log_max_bytes=256))
    try:
        raise ValueError("x" * 5000)
    except ValueError:
        logging.getLogger("tidegate.x").exception("failed")
    lines = logged.lines()
    assert "Traceback (most recent call last):" in lines
    assert max(len(line) for line in lines) < 300
    assert any(line.endswith("more bytes)") for line in lines)


def test_repeats_are_held_back_and_counted_once_the_interval_passed() -> None:
    clock = Clock()
    summary = RepeatSummary(30.0, clock)
    refused = "Connect to ipv4#10.0.0.%d:9092 failed (after %dms)"
    first = record(refused, 1, 0)
    assert summary.filter(first)
    assert first.getMessage() == "Connect to ipv4#10.0.0.1:9092 failed (after 0ms)"
    for n in range(5):  # the same failure, other numbers: held back
        clock.now += 1
        assert not summary.filter(record(refused, n, n))
    assert summary.filter(record("another failure"))
    assert summary.filter(record("debug lines always pass", level=logging.INFO))
    clock.now = 131.0
    later = record(refused, 2, 9)
    assert summary.filter(later)
    assert later.getMessage() == (
        "Connect to ipv4#10.0.0.2:9092 failed (after 9ms) [5 more like this in the last 31 s]"
    )
    clock.now += 1
    assert not summary.filter(record(refused, 3, 1))


@pytest.mark.slow  # 3 s of librdkafka reconnecting
def test_a_kafka_outage_writes_a_few_lines_not_one_per_reconnect(
    logged: Logged, capfd: pytest.CaptureFixture[str]
) -> None:
    logged.configure(TelemetrySettings())
    kafka = KafkaSettings(bootstrap_servers="127.0.0.1:1")  # nothing listens there
    producer = make_producer(kafka, {"reconnect.backoff.max.ms": 100})
    consumer = make_consumer(kafka, "unit-outage", {"reconnect.backoff.max.ms": 100})
    consumer.subscribe(["unit-outage"])
    deadline = time.monotonic() + 3.0
    try:
        while time.monotonic() < deadline:
            producer.poll(0.05)
            consumer.poll(0.05)
    finally:
        consumer.close()
    lines = logged.lines()
    refused = [line for line in lines if "Connection refused" in line]
    assert refused, "librdkafka's lines come through Python logging"
    assert all(" librdkafka: " in line for line in refused)
    # One line per kind of failure (producer's, consumer's) instead of dozens a second.
    assert len(refused) <= 4, "\n".join(refused)
    assert "Connection refused" not in capfd.readouterr().err


def test_another_exception_behind_the_same_words_is_let_through() -> None:
    summary = RepeatSummary(30.0, Clock())

    def failed(exc: Exception) -> logging.LogRecord:
        rec = record("unexpected error on /v2/models/fraud/infer", level=logging.ERROR)
        rec.exc_info = (type(exc), exc, None)
        return rec

    assert summary.filter(failed(KeyError("a")))
    assert not summary.filter(failed(KeyError("b")))
    assert summary.filter(failed(ValueError("c")))


def test_a_record_whose_arguments_do_not_fit_is_left_to_the_handler() -> None:
    broken = record("%d requests", "many")
    assert LineCap(64).filter(broken)
    assert RepeatSummary(30.0, Clock()).filter(broken)
