"""From a V2 request to the `InferenceRequest` record the gateway publishes (`new_record`): the
request id, the call's `budget` (its wait and deadline), its `lane`, and `divert` to a fallback.
Plain values in, plain values out.
Deadlines: docs/deadlines-and-faults.md ("Deadlines"); lanes: docs/lanes.md ("Choosing the
lane"); fallbacks: docs/breakers.md ("At the gateway").
"""

from __future__ import annotations

import math
import re
import secrets
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from tidegate.clients.producer import LANES, Lane
from tidegate.core.errors import InvalidInputError, ModelUnavailableError, PermissionDeniedError
from tidegate.gateway.gateway_settings import GatewaySettings
from tidegate.schemas.records import ReplyToRecord, RequestRecord, TensorRecord
from tidegate.schemas.requests import FALLBACK_OF, build_request
from tidegate.schemas.v2 import V2Request, scalar_parameters

__all__ = [
    "LANE",
    "REQUEST_TIMEOUT",
    "Budget",
    "budget",
    "divert",
    "is_request_id",
    "lane",
    "location",
    "new_nonce",
    "new_record",
    "request_id",
    "wait_s",
]

REQUEST_TIMEOUT = "Request-Timeout"
LANE = "Tidegate-Lane"
_REQUEST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


def location(request_id: str) -> str:
    """Where the result of a request is fetched."""
    return f"/v2/requests/{request_id}"


def is_request_id(value: str) -> bool:
    return _REQUEST_ID.match(value) is not None


def new_nonce() -> str:
    """A submission's nonce: 96 random bits, which no caller can guess or choose."""
    return secrets.token_urlsafe(12)


def request_id(given: str | None) -> str:
    """The caller's id when it is valid, else a new one (whether another call holds the id is
    for `tidegate.gateway.v2api.infer` and the result store to say)."""
    if given is None or given == "":
        return uuid.uuid4().hex
    if not is_request_id(given):
        raise InvalidInputError(
            "id must be 1-128 letters, digits, '.', '_', ':' or '-', starting with a letter "
            "or digit",
            "id",
        )
    return given


def lane(header: str | None, parameters: Mapping[str, Any]) -> Lane:
    """The call's lane from its raw `Tidegate-Lane` header and its request parameters; both may
    name it, but not two different lanes."""
    named: list[tuple[str, Any]] = []
    if header is not None:
        named.append((LANE, header.strip().lower()))
    if parameters.get("lane") is not None:
        named.append(("parameters.lane", parameters["lane"]))
    for where, value in named:
        if value not in LANES:
            raise InvalidInputError(f"the lane must be one of {', '.join(LANES)}", where)
    if len({value for _, value in named}) > 1:
        raise InvalidInputError(f"{LANE} and parameter 'lane' name different lanes", LANE)
    chosen: Lane = named[0][1] if named else "realtime"
    return chosen


@dataclass(frozen=True, slots=True)
class Budget:
    """How long a call waits for its answer (a synchronous call for its result, an
    asynchronous one for Kafka's acknowledgement), and the request's deadline in seconds from
    now (None: it has none)."""

    wait_s: float
    deadline_s: float | None


def budget(raw: str | None, settings: GatewaySettings, *, respond_async: bool) -> Budget:
    """The budget of a call from its raw `Request-Timeout` value."""
    if not respond_async:
        waits = wait_s(raw, settings)
        return Budget(waits, waits)
    asked = None if raw is None else _timeout(raw, settings)
    # librdkafka resolves every acknowledgement within `publish_timeout_s`, whatever the call
    # asked: waiting less would answer before knowing whether Kafka has the request.
    return Budget(
        settings.publish_timeout_s, asked if asked is not None else settings.async_deadline_s
    )


def wait_s(raw: str | None, settings: GatewaySettings) -> float:
    """Seconds a synchronous call waits, from the raw `Request-Timeout` value."""
    if raw is None:
        return min(settings.default_timeout_s, settings.max_timeout_s)
    return _timeout(raw, settings)


def _timeout(raw: str, settings: GatewaySettings) -> float:
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
    inputs: list[TensorRecord],
    request_id: str,
    reply_to: ReplyToRecord | None,
    deadline_s: float | None = None,
    nonce: str | None = None,
    tenant: str | None = None,
    routing_key: str | None = None,
) -> RequestRecord:
    """The record to publish; `reply_to` is this replica's reply partition, None while unheld,
    `deadline_s` the call's deadline in seconds from now (the earlier of it and Triton's
    `timeout` parameter is the request's), `nonce` this submission's (`new_nonce`), which
    its reply carries back, and `tenant` and `routing_key` the ones the caller's identity names,
    if any: the request then has them, and a parameter naming another is refused (403)."""
    params = scalar_parameters(v2.parameters, "parameters")
    params.pop("lane", None)  # the topic says it (`lane`)
    params.pop(FALLBACK_OF, None)  # only `divert` marks a request as diverted
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
        routing_key=_bound("routing key", params.pop("routing_key", None), routing_key),
        tenant=_bound("tenant", params.pop("tenant", None), tenant) or "default",
        deadline=_deadline(deadline_s, timeout_us),
        request_id=request_id,
        outputs=[o.name for o in v2.outputs or []],
        parameters=params,
        reply_to={**reply_to, "nonce": nonce},
    )


def _bound(what: str, asked: Any, identity_value: str | None) -> str | None:
    """The identity's value where it names one (a parameter may repeat it, never name another),
    else the caller's parameter."""
    if identity_value is None:
        return str(asked) if asked else None
    if asked and asked != identity_value:
        raise PermissionDeniedError(
            f"this caller's {what} is {identity_value!r}, not {str(asked)!r}"
        )
    return identity_value


def _deadline(deadline_s: float | None, timeout_us: int | None) -> timedelta | None:
    given = [timedelta(seconds=deadline_s)] if deadline_s is not None else []
    if timeout_us:
        given.append(timedelta(microseconds=timeout_us))
    return min(given, default=None)


def divert(record: RequestRecord, fallback: str, reason: str) -> RequestRecord:
    """`record` for the model's declared `fallback` instead, marked `<reason>@<model>`."""
    parameters = {**(record.get("parameters") or {}), FALLBACK_OF: f"{reason}@{record['model']}"}
    return {**record, "model": fallback, "model_version": None, "parameters": parameters}
