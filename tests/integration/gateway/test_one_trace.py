"""One real request, traced end to end: the gateway (uvicorn in a thread), the real Kafka, schema
registry, Redis and PostgreSQL, and the real worker with the tiny ONNX model
(tests/integration/workers.py), both exporting to one in-memory exporter.

The call's trace runs gateway -> Kafka produce -> worker -> reply, each hop a child of the one
before through the `traceparent` header of the message between them; the worker's batch is a span
of its own trace, linked to the request's, with the model call under it."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tests.integration.gateway.gateway_fixtures import GatewayServer
from tests.integration.workers import Stack, running
from tests.support import unique
from tidegate.core.telemetry_settings import TracingSettings
from tidegate.core.tracing import start_tracing
from tidegate.gateway.auth.auth_settings import AuthSettings
from tidegate.gateway.gateway_services import GatewayConfig, kafka_services
from tidegate.gateway.gateway_settings import GatewaySettings
from tidegate.models.model_settings import ModelSettings


def attrs(span: ReadableSpan) -> Mapping[str, Any]:
    return span.attributes or {}


def one(spans: tuple[ReadableSpan, ...], name: str) -> ReadableSpan:
    found = [span for span in spans if span.name == name]
    assert len(found) == 1, f"{name}: {[s.name for s in spans]}"
    return found[0]


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


async def test_one_trace_runs_from_the_gateway_through_kafka_and_the_worker_to_the_reply(
    stack: Stack, models: ModelSettings
) -> None:
    exporter = InMemorySpanExporter()
    traced = TracingSettings(enabled=True)
    worker_tracing = start_tracing(traced, "worker", exporter=exporter)
    gateway_tracing = start_tracing(traced, "gateway", exporter=exporter)
    config = GatewayConfig(
        gateway=GatewaySettings(replica_id=unique("replica"), admin=False),
        kafka=stack.kafka,
        topics=stack.topics,
        registry=stack.registry,
        auth=AuthSettings(enabled=False),  # not about authentication (test_auth.py is)
    )
    request_id = unique("traced")
    body = {
        "id": request_id,
        "inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}],
    }
    async with running(stack, models, tracing=worker_tracing):
        server = GatewayServer(config, functools.partial(kafka_services, tracing=gateway_tracing))
        # The worker runs on this loop: the gateway's blocking start and calls go to threads.
        await asyncio.to_thread(server.start)
        try:
            resp = await asyncio.to_thread(server.http.post, "/v2/models/tiny/infer", json=body)
        finally:
            await asyncio.to_thread(server.stop)
    assert resp.status_code == 200, resp.text
    assert resp.json()["id"] == request_id

    spans = exporter.get_finished_spans()
    requests = stack.topics.requests
    call = one(spans, "POST /v2/models/{model}/infer")
    sent = one(spans, f"send {requests}")
    processed = one(spans, f"process {requests}")
    reply = one(spans, "reply")
    batch = one(spans, "batch tiny")
    compute = one(spans, "compute")

    # One trace: the call, its request on Kafka, the worker's part and the reply, in that order.
    trace_id = call.context.trace_id
    assert call.parent is None
    assert {s.context.trace_id for s in (call, sent, processed, reply)} == {trace_id}
    assert parent_of(sent) == call.context.span_id
    assert parent_of(processed) == sent.context.span_id
    assert parent_of(reply) == processed.context.span_id
    assert [s.kind for s in (call, sent, processed, reply)] == [
        SpanKind.SERVER,
        SpanKind.PRODUCER,
        SpanKind.CONSUMER,
        SpanKind.CONSUMER,
    ]
    for span in (call, sent, processed, reply):
        assert attrs(span)["tidegate.request_id"] == request_id, span.name
    assert attrs(call)["http.response.status_code"] == 200
    assert attrs(processed)["tidegate.status"] == "OK"
    assert attrs(processed)["tidegate.model_version"] == "1"
    assert attrs(reply)["tidegate.reply"] == "awaited"
    # The call's span ends after the reply came: it holds everything after it.
    assert call.end_time is not None
    assert reply.end_time is not None
    assert call.end_time >= reply.end_time

    # The batch is a trace of its own, linked to its member's; the model call is under it.
    assert batch.context.trace_id != trace_id
    assert [link.context.span_id for link in batch.links] == [processed.context.span_id]
    assert parent_of(compute) == batch.context.span_id
    assert attrs(compute)["tidegate.model"] == "tiny"

    services = {s.name: s.resource.attributes["service.name"] for s in spans}
    assert services == {
        call.name: "tidegate-gateway",
        sent.name: "tidegate-gateway",
        reply.name: "tidegate-gateway",
        processed.name: "tidegate-worker",
        batch.name: "tidegate-worker",
        compute.name: "tidegate-worker",
    }
