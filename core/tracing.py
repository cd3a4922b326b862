"""OpenTelemetry tracing through Kafka: W3C trace context in message headers, one tracer each.

Off by default (`TracingSettings.enabled`): a component then holds `TRACING_OFF`, whose `tracer`
is None, and checks it once per batch or call, so no span is made and no header is read or
written. On, each component gets its own `TracerProvider`, so its spans carry its own
`service.name` even when a gateway and a worker share a process (as in the tests), and exports
them over OTLP from the SDK's batch processor thread, off the hot path.

Context crosses Kafka as `traceparent` and `tracestate` headers, written and read by
OpenTelemetry's W3C propagator; this module only adapts confluent-kafka's header lists
(`[(name, bytes)]`) to the propagator's carrier interface.

Sampling is parent-based: a span with a parent keeps its parent's decision. A root (a call that
brings no trace, a worker's batch) is sampled by `sample_ratio`, except that a root linked to a
sampled span is always sampled, so a sampled request's trace never links to a batch that is
missing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import (
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import Link, Span, SpanKind, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes

from tidegate.core.errors import ConfigurationError
from tidegate.core.telemetry_settings import TracingSettings

__all__ = [
    "TRACING_OFF",
    "KafkaHeaders",
    "Tracing",
    "context_from_headers",
    "context_from_http",
    "span_headers",
    "start_tracing",
    "traces_url",
]

KafkaHeaders = list[tuple[str, bytes]]
"""Message headers as confluent-kafka produces them."""

_PROPAGATOR = TraceContextTextMapPropagator()


class Tracing:
    """One component's tracer, or none when tracing is off (`TRACING_OFF`)."""

    __slots__ = ("_provider", "tracer")

    def __init__(self, tracer: Tracer | None = None, provider: TracerProvider | None = None):
        self.tracer = tracer
        self._provider = provider

    @property
    def enabled(self) -> bool:
        return self.tracer is not None

    def shutdown(self) -> None:
        """Export what is still buffered and stop the exporter."""
        if self._provider is not None:
            self._provider.shutdown()


TRACING_OFF = Tracing()


class _LinkedOrRatio(Sampler):
    """The root sampler: a span linked to a sampled one is sampled, others by ratio."""

    def __init__(self, ratio: float) -> None:
        self._ratio = TraceIdRatioBased(ratio)

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        if links and any(link.context.trace_flags.sampled for link in links):
            return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes, trace_state)
        return self._ratio.should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )

    def get_description(self) -> str:
        return f"LinkedOrRatio{{{self._ratio.get_description()}}}"


def start_tracing(
    settings: TracingSettings, component: str, *, exporter: SpanExporter | None = None
) -> Tracing:
    """`component`'s tracing (`TRACING_OFF` when disabled). With `exporter` (tests), spans are
    exported synchronously as they end; otherwise in batches over OTLP."""
    if not settings.enabled:
        return TRACING_OFF
    service = settings.service_name or f"tidegate-{component}"
    provider = TracerProvider(
        sampler=ParentBased(root=_LinkedOrRatio(settings.sample_ratio)),
        resource=Resource.create({"service.name": service}),
    )
    processor: SpanProcessor
    if exporter is not None:
        processor = SimpleSpanProcessor(exporter)
    else:
        processor = BatchSpanProcessor(_otlp_exporter(settings))
    provider.add_span_processor(processor)
    return Tracing(provider.get_tracer(f"tidegate.{component}"), provider)


def _otlp_exporter(settings: TracingSettings) -> SpanExporter:
    # Imported only when tracing is on: the exporters pull in HTTP and protobuf stacks that a
    # process without tracing never needs.
    if settings.protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError as exc:
            raise ConfigurationError(
                "TIDEGATE_TRACING_PROTOCOL=grpc needs the OTLP gRPC exporter: "
                "pip install 'tidegate[otlp-grpc]'"
            ) from exc
        exporter: SpanExporter = GrpcExporter(
            endpoint=settings.endpoint, timeout=settings.export_timeout_s
        )
        return exporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(
        endpoint=traces_url(settings.endpoint), timeout=settings.export_timeout_s
    )


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of a collector's base URL (a URL with a path is taken as is)."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep:
        raise ConfigurationError(f"the OTLP endpoint {endpoint!r} is not an http(s) URL")
    if "/" in rest.strip("/"):
        return endpoint
    return f"{scheme}://{rest.rstrip('/')}/v1/traces"


class _HeaderList(Getter[Sequence[tuple[str, Any]]]):
    """confluent-kafka's headers (a list of (name, bytes or None)) as a propagator carrier."""

    def get(self, carrier: Sequence[tuple[str, Any]], key: str) -> list[str] | None:
        found = [_text(value) for name, value in carrier if name == key and value is not None]
        return found or None

    def keys(self, carrier: Sequence[tuple[str, Any]]) -> list[str]:
        return [name for name, _ in carrier]


def _text(value: bytes | str) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


_HEADERS = _HeaderList()


def context_from_headers(
    headers: Sequence[tuple[str, Any]] | Mapping[str, Any] | None,
) -> Context:
    """The trace context a message carries (an empty one when it carries none)."""
    if not headers:
        return Context()
    if isinstance(headers, Mapping):
        return _PROPAGATOR.extract({k: _text(v) for k, v in headers.items() if v is not None})
    return _PROPAGATOR.extract(headers, getter=_HEADERS)


def context_from_http(headers: Mapping[str, str]) -> Context:
    """The trace context of an HTTP request's headers (an empty one when there is none)."""
    return _PROPAGATOR.extract(headers)


def span_headers(span: Span) -> KafkaHeaders:
    """Headers that carry `span`'s context to whoever reads the message."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return [(name, value.encode("latin-1")) for name, value in carrier.items()]
