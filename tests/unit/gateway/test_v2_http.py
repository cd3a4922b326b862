"""The HTTP edge (tests/unit/gateway_harness.py's fakes behind the app): a call's server span,
and, on raw ASGI where a test client cannot go, a caller that hangs up halfway through its
body."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from tests.unit.gateway_harness import Harness, features
from tidegate.core.telemetry_settings import TracingSettings
from tidegate.core.tracing import start_tracing
from tidegate.gateway.app import create_app

PATH = "/v2/models/fraud/infer"
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def scope() -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": PATH,
        "raw_path": PATH.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"1000")],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }


def test_a_client_gone_mid_body_is_one_short_line_not_two_tracebacks(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(harness.config, lambda _config: harness.services)
    sent: list[MutableMapping[str, Any]] = []
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": b'{"inputs": [{"name": "feat', "more_body": True},
        {"type": "http.disconnect"},
    ]

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    async def call() -> None:
        # An exception that left the app here is what uvicorn logs as a second traceback.
        await app(scope(), receive, send)

    with TestClient(app) as client, caplog.at_level(logging.DEBUG):
        assert client.portal is not None
        client.portal.call(call)
    assert [r for r in caplog.records if r.exc_info] == [], "no traceback at all"
    (line,) = [r for r in caplog.records if "went away" in r.getMessage()]
    assert line.levelno == logging.INFO
    assert PATH in line.getMessage()
    assert sent[0]["status"] == 499
    assert harness.worker.published == [], "nothing was published for it"


def test_a_call_is_a_server_span_that_continues_the_callers_trace(harness: Harness) -> None:
    exporter = InMemorySpanExporter()
    harness.services.tracing = start_tracing(
        TracingSettings(enabled=True), "gateway", exporter=exporter
    )
    with harness.client() as client:
        ok = client.post(PATH, json=features(id="t-1"), headers={"traceparent": TRACEPARENT})
        missing = client.post("/v2/models/fraud/versions/9/infer", json=features(id="t-2"))
    assert (ok.status_code, missing.status_code) == (200, 404)
    call, other = exporter.get_finished_spans()
    assert call.name == "POST /v2/models/{model}/infer"
    assert call.kind is SpanKind.SERVER
    assert f"{call.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert call.parent is not None
    assert f"{call.parent.span_id:016x}" == "b7ad6b7169203331"
    assert dict(call.attributes or {}) == {
        "http.request.method": "POST",
        "http.route": "/v2/models/{model}/infer",
        "url.path": PATH,
        "tidegate.model": "fraud",
        "http.response.status_code": 200,
        "tidegate.request_id": "t-1",
    }
    assert other.name == "POST /v2/models/{model}/versions/{version}/infer"
    assert other.parent is None, "a call without a traceparent starts a trace"
    assert other.status.status_code is StatusCode.UNSET, "a 4xx is the caller's, not an error"
