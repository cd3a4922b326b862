"""From a V2 request to the `InferenceRequest` record the gateway publishes: the request id, how
long a synchronous call waits, and the record itself. Plain values in, plain values out.

How long a synchronous call waits is the `Request-Timeout` header, in seconds, else
`GatewaySettings.default_timeout_s`, and never more than `max_timeout_s`. The request itself is
published without a deadline, so it is still computed when the caller stops waiting and its
result can be fetched at `/v2/requests/{id}`. Triton's request parameter `timeout`
(microseconds, as tritonclient's `timeout=` sends it) is the server-side deadline: it becomes the
request's `deadline`, past which the worker answers DEADLINE_EXCEEDED instead of computing.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from tidegate.core.errors import InvalidInputError, ModelUnavailableError
from tidegate.gateway.gateway_settings import GatewaySettings
from tidegate.schemas.requests import build_request
from tidegate.schemas.v2 import V2Request, scalar_parameters

__all__ = ["REQUEST_TIMEOUT", "is_request_id", "location", "new_record", "request_id", "wait_s"]

REQUEST_TIMEOUT = "Request-Timeout"
_REQUEST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


def location(request_id: str) -> str:
    """Where the result of a request is fetched."""
    return f"/v2/requests/{request_id}"


def is_request_id(value: str) -> bool:
    return _REQUEST_ID.match(value) is not None


def request_id(given: str | None, in_flight: Callable[[str], bool]) -> str:
    """The caller's id when it is valid and not in flight already, else a new one."""
    if given is None or given == "":
        return uuid.uuid4().hex
    if not is_request_id(given):
        raise InvalidInputError(
            "id must be 1-128 letters, digits, '.', '_', ':' or '-', starting with a letter "
            "or digit",
            "id",
        )
    if in_flight(given):
        raise InvalidInputError(f"a request with id {given!r} is already in flight", "id")
    return given


def wait_s(raw: str | None, settings: GatewaySettings) -> float:
    """Seconds a synchronous call waits, from the raw `Request-Timeout` value."""
    if raw is None:
        return min(settings.default_timeout_s, settings.max_timeout_s)
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise InvalidInputError(
            f"{REQUEST_TIMEOUT} must be a positive number of seconds", REQUEST_TIMEOUT
        )
    return min(value, settings.max_timeout_s)


def new_record(
    model: str,
    version: str | None,
    v2: V2Request,
    inputs: list[dict[str, Any]],
    request_id: str,
    reply_to: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The record to publish; `reply_to` is this replica's reply partition, None while unheld."""
    params = scalar_parameters(v2.parameters, "parameters")
    for name in ("routing_key", "tenant"):
        if params.get(name) is not None and not isinstance(params[name], str):
            raise InvalidInputError(f"parameter {name!r} must be a string", f"parameters.{name}")
    timeout_us = params.get("timeout")
    if timeout_us is not None and (
        isinstance(timeout_us, bool) or not isinstance(timeout_us, int) or timeout_us <= 0
    ):
        raise InvalidInputError(
            "parameter 'timeout' must be a positive number of microseconds",
            "parameters.timeout",
        )
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
