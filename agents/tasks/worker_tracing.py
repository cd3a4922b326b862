"""A worker's spans, made only when tracing is on (the worker checks once per poll and per batch):
a `process` span per request (`consumed`), a `batch` span per model batch linked to its members,
and a `compute` span per model call. Sampled-out traffic gets no span.
The spans and sampling: docs/observability.md ("One call's trace").
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext

from opentelemetry.trace import (
    Link,
    Span,
    SpanKind,
    Status,
    StatusCode,
    Tracer,
    get_current_span,
)

from tidegate.agents.tasks.decoding import KafkaMessage
from tidegate.agents.tasks.inference_task import InferenceTask
from tidegate.core.tracing import KafkaHeaders, context_from_headers, span_headers
from tidegate.schemas.records import ResultRecord

__all__ = ["batch_span", "compute_span", "consumed", "finished", "result_headers"]


def consumed(tracer: Tracer, msg: KafkaMessage, task: InferenceTask) -> None:
    """Start the request's span, under the trace its message carries. Its attributes are the
    few that tell one request's span from another: the SDK checks each attribute on every span,
    which costs more than the span itself; the topic is in the name, the model on the batch."""
    context = context_from_headers(msg.headers())
    caller = get_current_span(context).get_span_context()
    if caller.is_valid and not caller.trace_flags.sampled:
        return
    span = tracer.start_span(
        f"process {msg.topic()}",
        context=context,
        kind=SpanKind.CONSUMER,
        attributes={
            "messaging.destination.partition.id": str(msg.partition()),
            "messaging.kafka.offset": int(msg.offset() or 0),
            "tidegate.request_id": task.request_id,
        },
    )
    if span.is_recording():
        task.span = span


def batch_span(
    tracer: Tracer, tasks: Sequence[InferenceTask]
) -> AbstractContextManager[Span | None]:
    """The current span while a batch runs, linked to each member's span; none when no member
    is traced."""
    links = [Link(task.span.get_span_context()) for task in tasks if task.span is not None]
    if not links:
        return nullcontext()
    model = tasks[0].model
    return tracer.start_as_current_span(
        f"batch {model}",
        links=links,
        attributes={"tidegate.model": model, "tidegate.batch.size": len(tasks)},
    )


def compute_span(
    tracer: Tracer, model: str, version: str, rows: int, members: int
) -> AbstractContextManager[Span | None]:
    """One model call, under the batch span that is current (none when the batch has none)."""
    if not get_current_span().is_recording():
        return nullcontext()
    return tracer.start_as_current_span(
        "compute",
        attributes={
            "tidegate.model": model,
            "tidegate.model_version": version,
            "tidegate.rows": rows,
            "tidegate.batch.size": members,
        },
    )


def result_headers(task: InferenceTask) -> KafkaHeaders | None:
    """Headers that carry the request's span on with its result and reply."""
    return span_headers(task.span) if task.span is not None else None


def finished(task: InferenceTask, result: ResultRecord) -> None:
    """The result is produced: the request's span ends, saying how it was answered."""
    span = task.span
    if span is None:
        return
    task.span = None
    status = str(result["status"])
    span.set_attribute("tidegate.status", status)
    if result.get("model_version"):
        span.set_attribute("tidegate.model_version", str(result["model_version"]))
    if status != "OK":
        error = result.get("error")
        span.set_status(Status(StatusCode.ERROR, error["code"] if error else status))
    span.end()
