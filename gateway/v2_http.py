"""The HTTP edge of inference: an `InferCall` read from a request, and an `Outcome` or a stored
result rendered as the response (V2 JSON, Triton binary outputs, or a problem), with the metrics
of the call. Everything HTTP about an inference call is here; `tidegate.gateway.infer` does the
rest on plain values."""

from __future__ import annotations

import time

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from tidegate.core.errors import ResultTimeoutError, TidegateError
from tidegate.gateway import http_metrics as metrics
from tidegate.gateway.body import read_body
from tidegate.gateway.call_record import REQUEST_TIMEOUT, location
from tidegate.gateway.infer import InferCall, Inference, Outcome
from tidegate.gateway.problems import error_problem
from tidegate.gateway.responses import render_result
from tidegate.schemas.v2_binary import HEADER_LENGTH

__all__ = ["fetch", "infer", "prefers_async", "respond"]


def prefers_async(request: Request) -> bool:
    """RFC 7240: `Prefer: respond-async`, possibly among other preferences."""
    prefs = ",".join(request.headers.getlist("prefer"))
    return any(
        p.split(";")[0].split("=")[0].strip().lower() == "respond-async" for p in prefs.split(",")
    )


async def infer(
    inference: Inference, request: Request, model: str, version: str | None
) -> Response:
    started = time.perf_counter()
    try:
        inference.shed()
        body = await read_body(request, inference.max_body_bytes)
    except TidegateError as exc:
        outcome = Outcome(None, error=exc)
    else:
        headers = request.headers
        call = InferCall(
            model,
            version,
            body,
            header_length=headers.get(HEADER_LENGTH),
            timeout=headers.get(REQUEST_TIMEOUT),
            respond_async=prefers_async(request),
        )
        outcome = await inference.infer(call)
    response = respond(outcome, request.url.path)
    metrics.count_request(outcome.model, outcome.version, response.status_code)
    if response.status_code != 202:
        metrics.observe_latency(outcome.model, time.perf_counter() - started)
    return response


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


async def fetch(inference: Inference, request_id: str) -> Response:
    instance = location(request_id)
    try:
        stored = await inference.lookup(request_id)
    except TidegateError as exc:
        return error_problem(exc, instance=instance, request_id=request_id)
    if stored.result is None:
        return JSONResponse(
            {"id": request_id, "status": "PENDING"},
            status_code=202,
            headers={"Location": instance, "Retry-After": "1"},
        )
    return render_result(stored.result, stored.prefs, instance=instance)
