"""Tracing settings, the W3C context through Kafka headers and HTTP headers, and the sampler."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, get_current_span
from pydantic import ValidationError

from tidegate.core.errors import ConfigurationError
from tidegate.core.telemetry_settings import TracingSettings
from tidegate.core.tracing import (
    TRACING_OFF,
    Tracing,
    context_from_headers,
    context_from_http,
    span_headers,
    start_tracing,
    traces_url,
)

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def on(exporter: InMemorySpanExporter, component: str = "unit", **settings: Any) -> Tracing:
    return start_tracing(TracingSettings(enabled=True, **settings), component, exporter=exporter)


def test_tracing_is_off_by_default_and_then_makes_nothing() -> None:
    settings = TracingSettings()
    assert settings.enabled is False
    assert settings.protocol == "http/protobuf"
    assert settings.sample_ratio == 1.0
    tracing = start_tracing(settings, "worker")
    assert tracing is TRACING_OFF
    assert tracing.tracer is None
    assert not tracing.enabled
    tracing.shutdown()  # nothing to flush


def test_settings_come_from_the_environment_and_refuse_what_they_do_not_know(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TIDEGATE_TRACING_ENABLED", "true")
    monkeypatch.setenv("TIDEGATE_TRACING_SAMPLE_RATIO", "0.25")
    monkeypatch.setenv("TIDEGATE_TRACING_PROTOCOL", "grpc")
    settings = TracingSettings()
    assert (settings.enabled, settings.sample_ratio, settings.protocol) == (True, 0.25, "grpc")
    with pytest.raises(ValidationError, match="extra"):
        TracingSettings(sampling=0.5)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        TracingSettings(sample_ratio=1.5)
    with pytest.raises(ValidationError):
        TracingSettings(protocol="zipkin")


def test_each_component_names_its_service_unless_one_is_given() -> None:
    exporter = InMemorySpanExporter()
    for tracing in (on(exporter, "gateway"), on(exporter, "worker", service_name="fraud-scorer")):
        assert tracing.tracer is not None
        tracing.tracer.start_span("s").end()
    names = [span.resource.attributes["service.name"] for span in exporter.get_finished_spans()]
    assert names == ["tidegate-gateway", "fraud-scorer"]


def test_the_context_crosses_kafka_headers_to_a_child_span() -> None:
    exporter = InMemorySpanExporter()
    tracer = on(exporter).tracer
    assert tracer is not None
    sent = tracer.start_span("send", kind=SpanKind.PRODUCER)
    headers = span_headers(sent)
    assert [name for name, _ in headers] == ["traceparent"]
    assert all(isinstance(value, bytes) for _, value in headers)
    # Other headers around it are left alone; a missing value does not trip the reader.
    received = [("tenant", b"t1"), ("empty", None), *headers]
    tracer.start_span("process", context=context_from_headers(received)).end()
    (child,) = exporter.get_finished_spans()
    assert child.context.trace_id == sent.get_span_context().trace_id
    assert child.parent is not None
    assert child.parent.span_id == sent.get_span_context().span_id


@pytest.mark.parametrize(
    "headers", [None, [], [("traceparent", b"not-a-traceparent")], [("tenant", b"t1")]]
)
def test_a_message_without_a_valid_context_starts_no_trace_of_its_own(
    headers: list[tuple[str, bytes]] | None,
) -> None:
    assert not get_current_span(context_from_headers(headers)).get_span_context().is_valid


def test_an_http_callers_trace_is_continued() -> None:
    context = get_current_span(context_from_http({"traceparent": TRACEPARENT}))
    span_context = context.get_span_context()
    assert span_context.is_remote
    assert span_context.trace_flags.sampled
    assert f"{span_context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"


def test_sampling_follows_the_parent_and_a_link_to_a_sampled_span() -> None:
    exporter = InMemorySpanExporter()
    tracer = on(exporter, sample_ratio=0.0).tracer
    assert tracer is not None
    assert not tracer.start_span("a root").is_recording(), "ratio 0 samples no new trace"
    sampled_caller = context_from_http({"traceparent": TRACEPARENT})
    child = tracer.start_span("child", context=sampled_caller)
    assert child.is_recording(), "a sampled caller's trace is kept"
    unsampled = context_from_http({"traceparent": TRACEPARENT[:-2] + "00"})
    assert not tracer.start_span("child", context=unsampled).is_recording()
    linked = tracer.start_span("batch", links=[Link(child.get_span_context())])
    assert linked.is_recording(), "a batch linked to a sampled request is sampled too"


@pytest.mark.parametrize(
    ("endpoint", "url"),
    [
        ("http://collector:4318", "http://collector:4318/v1/traces"),
        ("https://collector:4318/", "https://collector:4318/v1/traces"),
        ("https://otlp.example/api/v1/traces", "https://otlp.example/api/v1/traces"),
    ],
)
def test_the_http_traces_url(endpoint: str, url: str) -> None:
    assert traces_url(endpoint) == url


def test_a_bad_endpoint_or_a_missing_grpc_exporter_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="URL"):
        start_tracing(TracingSettings(enabled=True, endpoint="collector:4318"), "unit")
    try:
        import opentelemetry.exporter.otlp.proto.grpc  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigurationError, match="otlp-grpc"):
            start_tracing(TracingSettings(enabled=True, protocol="grpc"), "unit")


def test_the_otlp_exporter_is_built_and_shut_down_without_a_collector() -> None:
    tracing = start_tracing(
        TracingSettings(enabled=True, endpoint="http://127.0.0.1:1", export_timeout_s=0.5), "unit"
    )
    assert tracing.tracer is not None
    tracing.tracer.start_span("unexported").end()
    tracing.shutdown()  # the export fails (nothing listens) and is only logged
