"""The worker's spans, on `tests.unit.agents.worker_support`'s fakes with an in-memory exporter:
each request's span joins the trace its message carries and hands it on in the result's headers, a
batch is one span linked to all its members, a model call is a span under its batch; a request
sampled out upstream makes none; with tracing off, no message header is read at all."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode, get_current_span

from tests.support import unique
from tests.unit.agents.dataplane_support import make_service, task
from tests.unit.agents.dataplane_support import until as dataplane_until
from tests.unit.agents.worker_support import FakeConsumer, Harness, Record, rebalanced
from tidegate.agents.tasks.worker_tracing import batch_span
from tidegate.core.telemetry_settings import TracingSettings
from tidegate.core.tracing import (
    Tracing,
    context_from_headers,
    span_headers,
    start_tracing,
)


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracing(exporter: InMemorySpanExporter) -> Tracing:
    return start_tracing(TracingSettings(enabled=True), "worker", exporter=exporter)


def attrs(span: ReadableSpan) -> Mapping[str, Any]:
    return span.attributes or {}


def named(spans: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name.startswith(prefix)]


async def test_each_request_joins_its_callers_trace_and_its_batch_links_them_all(
    harness: Harness,
    tracing: Tracing,
    exporter: InMemorySpanExporter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert tracing.tracer is not None
    sent = tracing.tracer.start_span("send requests", kind=SpanKind.PRODUCER)
    headers = span_headers(sent)
    sent.end()
    monkeypatch.setattr(Record, "headers", lambda _self: headers)
    consumer = FakeConsumer(unique("requests"))
    await harness.start(consumer, tracing=tracing)
    await rebalanced(consumer, "assign", 0)
    consumer.append(0, 3)  # one poll, one batch
    publisher = harness.publisher
    await dataplane_until(lambda: len(publisher.acks) == 3)

    spans = exporter.get_finished_spans()
    process = {str(attrs(span)["tidegate.request_id"]): span for span in named(spans, "process")}
    assert set(process) == {"p0-0", "p0-1", "p0-2"}
    caller = sent.get_span_context()
    for span in process.values():
        assert span.kind is SpanKind.CONSUMER
        assert span.context.trace_id == caller.trace_id
        assert span.parent is not None
        assert span.parent.span_id == caller.span_id
        assert attrs(span)["tidegate.status"] == "OK"
        assert attrs(span)["messaging.destination.partition.id"] == "0"
    (batch,) = named(spans, "batch fraud")
    assert batch.parent is None, "a batch has many parents: it roots a trace of its own"
    assert batch.context.trace_id != caller.trace_id
    assert attrs(batch)["tidegate.batch.size"] == 3
    assert {link.context.span_id for link in batch.links} == {
        span.context.span_id for span in process.values()
    }
    for request_id, span in process.items():
        carried = get_current_span(context_from_headers(publisher.headers[request_id]))
        assert carried.get_span_context().span_id == span.context.span_id, request_id


async def test_with_tracing_off_headers_are_read_once_for_lineage_and_none_is_written(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[int] = []

    def headers(record: Record) -> list[tuple[str, bytes]]:
        reads.append(record.offset())
        return []

    monkeypatch.setattr(Record, "headers", headers)
    consumer = FakeConsumer(unique("requests"))
    await harness.start(consumer)
    await rebalanced(consumer, "assign", 0)
    consumer.append(0, 4)
    publisher = harness.publisher
    await dataplane_until(lambda: len(publisher.acks) == 4)
    # Once per request, for its redelivery history (`dlq.redelivery`); tracing adds no read.
    assert sorted(reads) == [0, 1, 2, 3]
    assert set(publisher.headers.values()) == {None}


async def test_a_model_call_is_a_span_under_its_batch(
    tracing: Tracing, exporter: InMemorySpanExporter
) -> None:
    service, _ = make_service()
    service.tracer = tracing.tracer
    assert tracing.tracer is not None
    tasks = [task("a"), task("b"), task("bad", shape=[1, 3])]
    for member in tasks:
        member.span = tracing.tracer.start_span(f"process {member.request_id}")
    with batch_span(tracing.tracer, tasks) as batch:
        assert batch is not None
        results = await service.process(tasks, [0.0] * 3)
    assert [r["status"] for r in results] == ["OK", "OK", "INVALID"]
    (compute,) = named(exporter.get_finished_spans(), "compute")
    assert compute.parent is not None
    assert compute.parent.span_id == batch.get_span_context().span_id
    assert attrs(compute)["tidegate.model_version"] == "1"
    assert attrs(compute)["tidegate.batch.size"] == 2, "the invalid one needs no compute"


async def test_a_request_that_failed_ends_its_span_as_an_error(
    harness: Harness,
    tracing: Tracing,
    exporter: InMemorySpanExporter,
) -> None:
    async def failing(tasks: Any, waits: Any) -> list[dict[str, Any]]:
        raise RuntimeError("the model fell over")

    consumer = FakeConsumer(unique("requests"))
    await harness.start(consumer, tracing=tracing, process=failing)
    await rebalanced(consumer, "assign", 0)
    consumer.append(0, 1)
    await dataplane_until(lambda: len(harness.publisher.acks) == 1)
    (span,) = named(exporter.get_finished_spans(), "process")
    assert span.status.status_code is StatusCode.ERROR
    assert attrs(span)["tidegate.status"] == "ERROR"
    assert span.parent is None, "a message without trace context starts a trace"


async def test_requests_sampled_out_upstream_cost_no_span_and_carry_nothing_on(
    harness: Harness,
    tracing: Tracing,
    exporter: InMemorySpanExporter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    unsampled = [("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00")]
    monkeypatch.setattr(Record, "headers", lambda _self: unsampled)
    consumer = FakeConsumer(unique("requests"))
    await harness.start(consumer, tracing=tracing)
    await rebalanced(consumer, "assign", 0)
    consumer.append(0, 3)
    publisher = harness.publisher
    await dataplane_until(lambda: len(publisher.acks) == 3)
    assert exporter.get_finished_spans() == (), "no member span, so no batch span either"
    assert set(publisher.headers.values()) == {None}
