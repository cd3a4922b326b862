"""The HTTP edge of inference: an `InferCall` read from a request, and an `Outcome` or a stored
result rendered as the response (V2 JSON, Triton binary outputs, or a problem), with the metrics
of the call. Everything HTTP about an inference call is here; `tidegate.gateway.v2api.infer` does
the rest on plain values.

With tracing on, each call is a server span (continuing a caller's `traceparent`), current while
the core publishes the request and waits, and ended once the reply made the response. A caller
that hangs up while sending its body is answered 499 (nobody reads it) with one INFO line.
"""

from __future__ import annotations

import logging
import time

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer
from starlette.requests import ClientDisconnect

from tidegate.core.errors import ResultTimeoutError, TidegateError
from tidegate.core.tracing import context_from_http
from tidegate.gateway import http_metrics as metrics
from tidegate.gateway.auth.identity import Identity
from tidegate.gateway.problems import error_problem
from tidegate.gateway.v2api.body import read_body
from tidegate.gateway.v2api.call_record import LANE, REQUEST_TIMEOUT, location
from tidegate.gateway.v2api.infer import UNKNOWN_MODEL, InferCall, Inference, Outcome
from tidegate.gateway.v2api.responses import render_result
from tidegate.schemas.v2_binary import HEADER_LENGTH

__all__ = ["CLIENT_GONE", "fetch", "infer", "prefers_async", "respond"]

_log = logging.getLogger(__name__)

CLIENT_GONE = 499
"""The status (nginx's) of a call whose caller hung up before its body was read: no one reads it."""


def prefers_async(request: Request) -> bool:
    """RFC 7240: `Prefer: respond-async`, possibly among other preferences."""
    prefs = ",".join(request.headers.getlist("prefer"))
    return any(
        p.split(";")[0].split("=")[0].strip().lower() == "respond-async" for p in prefs.split(",")
    )


async def infer(
    inference: Inference, request: Request, model: str, version: str | None
) -> Response:
    tracer = inference.tracer
    if tracer is None:
        response, _ = await _infer(inference, request, model, version)
        return response
    return await _traced(tracer, inference, request, model, version)


async def _traced(
    tracer: Tracer, inference: Inference, request: Request, model: str, version: str | None
) -> Response:
    route = "/v2/models/{model}/versions/{version}/infer" if version else "/v2/models/{model}/infer"
    with tracer.start_as_current_span(
        f"POST {route}",
        context=context_from_http(request.headers),
        kind=SpanKind.SERVER,
        attributes={
            "http.request.method": "POST",
            "http.route": route,
            "url.path": request.url.path,
            "tidegate.model": model,
        },
    ) as span:
        response, request_id = await _infer(inference, request, model, version)
        span.set_attribute("http.response.status_code", response.status_code)
        if request_id is not None:
            span.set_attribute("tidegate.request_id", request_id)
        if response.status_code >= 500:
            span.set_status(Status(StatusCode.ERROR))
        return response


async def _infer(
    inference: Inference, request: Request, model: str, version: str | None
) -> tuple[Response, str | None]:
    """The response, and the request id when the call got that far."""
    started = time.perf_counter()
    try:
        inference.shed()
        body = await read_body(request, inference.max_body_bytes)
    except TidegateError as exc:
        outcome = Outcome(None, error=exc)
    except ClientDisconnect:
        # Not the server's fault and nobody reads the answer: a traceback (two, with uvicorn's)
        # per hang-up only buried real errors under load.
        _log.info("the client went away while sending the body of %s", request.url.path)
        metrics.count_request(UNKNOWN_MODEL, "", CLIENT_GONE)
        return Response(status_code=CLIENT_GONE), None
    else:
        headers = request.headers
        identity: Identity | None = getattr(request.state, "identity", None)
        call = InferCall(
            model,
            version,
            body,
            header_length=headers.get(HEADER_LENGTH),
            timeout=headers.get(REQUEST_TIMEOUT),
            respond_async=prefers_async(request),
            owner=identity.subject if identity is not None else None,
            lane=headers.get(LANE),
            tenant=identity.tenant if identity is not None else None,
            routing_key=identity.routing_key if identity is not None else None,
        )
        outcome = await inference.infer(call)
    response = respond(outcome, request.url.path)
    metrics.count_request(outcome.model, outcome.version, response.status_code)
    if response.status_code != 202:
        metrics.observe_latency(outcome.model, time.perf_counter() - started)
    return response, outcome.request_id


def respond(outcome: Outcome, path: str) -> Response:
    request_id = outcome.request_id
    instance = location(request_id) if request_id else path
    if outcome.error is not None:
        # A 504 points at where the result can be fetched later.
        later = request_id is not None and isinstance(outcome.error, ResultTimeoutError)
        return error_problem(
            outcome.error,
            instance=instance,
            request_id=request_id,
            headers={"Location": instance} if later else None,
        )
    if outcome.result is None:
        return JSONResponse(
            {"id": request_id, "model_name": outcome.model, "status": "PENDING"},
            status_code=202,
            headers={"Location": instance, "Preference-Applied": "respond-async"},
        )
    return render_result(outcome.result, outcome.prefs, instance=instance)


async def fetch(inference: Inference, request_id: str, caller: Identity) -> Response:
    """The stored request `request_id`, if `caller` may see it (its owner, or an unscoped admin);
    else 404, as for an unknown id."""
    instance = location(request_id)
    try:
        stored = await inference.lookup(request_id, caller)
    except TidegateError as exc:
        return error_problem(exc, instance=instance, request_id=request_id)
    if stored.result is None:
        return JSONResponse(
            {"id": request_id, "status": "PENDING"},
            status_code=202,
            headers={"Location": instance, "Retry-After": "1"},
        )
    return render_result(stored.result, stored.prefs, instance=instance)
