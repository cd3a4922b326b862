"""One inference call: read, check, publish, then wait (synchronous) or hand out a ticket
(asynchronous, `Prefer: respond-async`).

How long a synchronous call waits is the `Request-Timeout` header, in seconds, else
`GatewaySettings.default_timeout_s`, and never more than `max_timeout_s`. The request itself is
published without a deadline, so it is still computed when the caller stops waiting and its
result can be fetched at `/v2/requests/{id}`. Triton's request parameter `timeout`
(microseconds, as tritonclient's `timeout=` sends it) is the server-side deadline: it becomes the
request's `deadline`, past which the worker answers DEADLINE_EXCEEDED instead of computing.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
import uuid
from datetime import timedelta
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from tidegate.clients.producer import PublishError
from tidegate.core.errors import (
    InvalidInputError,
    ModelUnavailableError,
    ResultTimeoutError,
    TidegateError,
)
from tidegate.gateway import http_metrics as metrics
from tidegate.gateway.admission import Admission
from tidegate.gateway.backends import GatewayServices
from tidegate.gateway.body import read_body
from tidegate.gateway.gateway_settings import GatewaySettings
from tidegate.gateway.http_errors import RequestNotFoundError
from tidegate.gateway.problems import error_problem
from tidegate.gateway.replies import ReplyRouter
from tidegate.gateway.responses import OutputPrefs, render_result
from tidegate.schemas.requests import build_request
from tidegate.schemas.v2 import V2Request, input_records, parse_request, scalar_parameters
from tidegate.schemas.v2_binary import HEADER_LENGTH, split_body

__all__ = ["REQUEST_TIMEOUT", "Inference", "location", "prefers_async"]

REQUEST_TIMEOUT = "Request-Timeout"
_REQUEST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


def location(request_id: str) -> str:
    return f"/v2/requests/{request_id}"


def prefers_async(request: Request) -> bool:
    """RFC 7240: `Prefer: respond-async`, possibly among other preferences."""
    prefs = ",".join(request.headers.getlist("prefer"))
    return any(
        p.split(";")[0].split("=")[0].strip().lower() == "respond-async" for p in prefs.split(",")
    )


class Inference:
    def __init__(
        self,
        settings: GatewaySettings,
        services: GatewayServices,
        router: ReplyRouter,
        admission: Admission,
    ) -> None:
        self._settings = settings
        self._services = services
        self._router = router
        self._admission = admission

    def _request_id(self, given: str | None) -> str:
        if given is None or given == "":
            return uuid.uuid4().hex
        if not _REQUEST_ID.match(given):
            raise InvalidInputError(
                "id must be 1-128 letters, digits, '.', '_', ':' or '-', starting with a letter "
                "or digit",
                "id",
            )
        if self._router.is_waiting(given):
            raise InvalidInputError(f"a request with id {given!r} is already in flight", "id")
        return given

    def _wait_s(self, request: Request) -> float:
        raw = request.headers.get(REQUEST_TIMEOUT)
        if raw is None:
            return min(self._settings.default_timeout_s, self._settings.max_timeout_s)
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise InvalidInputError(
                f"{REQUEST_TIMEOUT} must be a positive number of seconds", REQUEST_TIMEOUT
            )
        return min(value, self._settings.max_timeout_s)

    def _record(
        self,
        model: str,
        version: str | None,
        v2: V2Request,
        inputs: list[dict[str, Any]],
        request_id: str,
    ) -> dict[str, Any]:
        params = scalar_parameters(v2.parameters, "parameters")
        for name in ("routing_key", "tenant"):
            if params.get(name) is not None and not isinstance(params[name], str):
                raise InvalidInputError(
                    f"parameter {name!r} must be a string", f"parameters.{name}"
                )
        timeout_us = params.get("timeout")
        if timeout_us is not None and (
            isinstance(timeout_us, bool) or not isinstance(timeout_us, int) or timeout_us <= 0
        ):
            raise InvalidInputError(
                "parameter 'timeout' must be a positive number of microseconds",
                "parameters.timeout",
            )
        reply_to = self._services.feed.reply_to()
        if reply_to is None:
            raise ModelUnavailableError("this gateway replica holds no reply partition yet")
        return build_request(
            model,
            inputs,
            version=version,
            routing_key=str(params.pop("routing_key")) if params.get("routing_key") else None,
            tenant=str(params.pop("tenant", None) or "default"),
            deadline=timedelta(microseconds=timeout_us) if timeout_us else None,
            request_id=request_id,
            outputs=[o.name for o in v2.outputs or []],
            parameters=params,
            reply_to=reply_to,
        )

    async def infer(self, request: Request, model: str, version: str | None) -> Response:
        started = time.perf_counter()
        request_id: str | None = None
        known_model, served = "_unknown", version or ""
        headers: dict[str, str] = {}
        try:
            self._admission.check()
            body = await read_body(request, self._settings.max_body_bytes)
            header, binary = split_body(body, request.headers.get(HEADER_LENGTH))
            v2 = parse_request(header)
            request_id = self._request_id(v2.id)
            signature = await self._services.catalog.signature(model, version)
            known_model = model
            inputs = input_records(v2, binary, signature)
            wait_s = self._wait_s(request)
            record = self._record(model, version, v2, inputs, request_id)
            meta = {"model": model, "prefs": OutputPrefs.from_request(v2).to_meta()}
            headers["Location"] = location(request_id)
            if prefers_async(request):
                response = await self._submit(record, meta, wait_s)
            else:
                result = await self._call(record, meta, wait_s)
                served = str(result.get("model_version") or served)
                prefs = OutputPrefs.from_request(v2)
                response = render_result(result, prefs, instance=location(request_id))
        except TidegateError as exc:
            instance = location(request_id) if request_id else request.url.path
            timed_out = isinstance(exc, ResultTimeoutError)
            response = error_problem(
                exc,
                instance=instance,
                request_id=request_id,
                headers=headers if timed_out else None,
            )
        metrics.REQUESTS.labels(known_model, served, str(response.status_code)).inc()
        if response.status_code != 202:
            metrics.LATENCY.labels(known_model).observe(time.perf_counter() - started)
        return response

    async def _publish(self, record: dict[str, Any], meta: dict[str, Any]) -> None:
        request_id = str(record["request_id"])
        await self._services.store.save(request_id, meta=meta)
        try:
            await self._services.publisher.publish(record)
        except PublishError:
            await self._services.store.discard(request_id)
            raise

    async def _submit(
        self, record: dict[str, Any], meta: dict[str, Any], wait_s: float
    ) -> Response:
        request_id = str(record["request_id"])
        self._admission.admit(request_id, ttl_s=self._settings.max_timeout_s)
        try:
            async with asyncio.timeout(wait_s):
                await self._publish(record, meta)
        except TimeoutError:
            raise ResultTimeoutError(
                f"Kafka did not acknowledge {request_id} within {wait_s}s"
            ) from None
        except BaseException:
            self._admission.release(request_id)
            raise
        return JSONResponse(
            {"id": request_id, "model_name": record["model"], "status": "PENDING"},
            status_code=202,
            headers={"Location": location(request_id), "Preference-Applied": "respond-async"},
        )

    async def _call(
        self, record: dict[str, Any], meta: dict[str, Any], wait_s: float
    ) -> dict[str, Any]:
        request_id = str(record["request_id"])
        self._admission.admit(request_id)
        future = self._router.expect(request_id)
        started = time.perf_counter()
        try:
            # Publishing is never cut short by the caller's timeout: a 504 promises a request that
            # still completes and can be fetched later, so it must have reached Kafka.
            await self._publish(record, meta)
            async with asyncio.timeout(max(0.0, wait_s - (time.perf_counter() - started))):
                return await future
        except TimeoutError:
            raise ResultTimeoutError(
                f"no result for {request_id} within {wait_s}s; it stays retrievable at "
                f"{location(request_id)}"
            ) from None
        finally:
            self._router.forget(request_id)
            self._admission.release(request_id)

    async def fetch(self, request_id: str) -> Response:
        instance = location(request_id)
        try:
            stored = (
                await self._services.store.get(request_id)
                if _REQUEST_ID.match(request_id)
                else None
            )
            if stored is None:
                raise RequestNotFoundError(f"no request {request_id!r} is known, or it expired")
            if stored.result is None:
                return JSONResponse(
                    {"id": request_id, "status": "PENDING"},
                    status_code=202,
                    headers={"Location": instance, "Retry-After": "1"},
                )
            result = await asyncio.to_thread(self._services.decode_result, stored.result)
            prefs = OutputPrefs.from_meta((stored.meta or {}).get("prefs"))
            return render_result(result, prefs, instance=instance)
        except TidegateError as exc:
            return error_problem(exc, instance=instance, request_id=request_id)
