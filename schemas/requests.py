"""`InferenceRequest` records: how the producer client and the gateway build them and key them.

No I/O: building a record is the same whoever publishes it afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from tidegate.schemas.records import ParameterValue, ReplyToRecord, RequestRecord, TensorRecord

__all__ = [
    "FALLBACK_OF",
    "SUBMISSION_HEADER",
    "Inputs",
    "build_request",
    "diverted_from",
    "fallback_allowed",
    "request_key",
]

FALLBACK_OF = "fallback_of"
"""The request parameter a gateway sets on a request it sent to the model's declared fallback
instead (`<reason>@<model>`): the worker records `fallback:<reason>@<model>` as its routing rule,
and never diverts it again. Callers cannot set it: the gateway drops theirs."""
_NO = ("false", "0", "no", "off")

SUBMISSION_HEADER = "tidegate-submission"
"""The reply's header that carries its request's `reply_to.nonce`: which submission it answers.
A gateway hands a reply to a waiting call, or stores it for a kept request, only when the nonce
is that submission's, so a request id alone (which callers may choose) never claims a result."""

Inputs = Mapping[str, Any] | Sequence[Mapping[str, Any]]
"""Named arrays, or `Tensor` records as they are."""


def _tensors(inputs: Inputs) -> list[TensorRecord]:
    if isinstance(inputs, Mapping):
        return _named_arrays(inputs)
    # Tensor records are taken as they are: the encoder checks them against the schema.
    return [cast(TensorRecord, dict(tensor)) for tensor in inputs]


def _named_arrays(inputs: Mapping[str, Any]) -> list[TensorRecord]:
    # numpy is imported only for named arrays: the producer client's base install has none, and
    # takes `Tensor` records as they are (`pip install 'tidegate[arrays]'` for named arrays).
    try:
        import numpy as np

        from tidegate.schemas.tensors import from_numpy
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            "named arrays need numpy: pip install 'tidegate[arrays]', or pass Tensor records"
        ) from exc
    return [from_numpy(name, np.asarray(value)) for name, value in inputs.items()]


def _deadline(deadline: datetime | timedelta | None, now: datetime) -> datetime | None:
    if isinstance(deadline, timedelta):
        return now + deadline
    return deadline


def build_request(
    model: str,
    inputs: Inputs,
    *,
    version: str | None = None,
    routing_key: str | None = None,
    tenant: str = "default",
    deadline: datetime | timedelta | None = None,
    request_id: str | None = None,
    outputs: Sequence[str] = (),
    parameters: Mapping[str, ParameterValue] | None = None,
    reply_to: ReplyToRecord | None = None,
    entity_key: str | None = None,
) -> RequestRecord:
    """An `InferenceRequest` record; `inputs` are named arrays or `Tensor` records. With
    `entity_key`, the worker fills the model's declared features the inputs lack from the online
    feature store."""
    now = datetime.now(UTC)
    return {
        "request_id": request_id or uuid.uuid4().hex,
        "model": model,
        "model_version": version,
        "tenant": tenant,
        "routing_key": routing_key,
        "inputs": _tensors(inputs),
        "outputs": list(outputs),
        "parameters": dict(parameters or {}),
        "deadline": _deadline(deadline, now),
        "created_at": now,
        "reply_to": reply_to or None,
        "entity_key": entity_key,
    }


def request_key(record: Mapping[str, Any]) -> bytes:
    """The Kafka key of a request (and of its result): routing key, else request id."""
    return str(record.get("routing_key") or record["request_id"]).encode()


def fallback_allowed(parameters: Mapping[str, Any] | None) -> bool:
    """The caller's say on a fallback model (`parameters.fallback`, true unless false-like); a
    request already diverted (`FALLBACK_OF`) is never diverted again."""
    params = parameters or {}
    if params.get(FALLBACK_OF) is not None:
        return False
    allowed = params.get("fallback")
    return allowed is None or str(allowed).lower() not in _NO


def diverted_from(parameters: Mapping[str, Any] | None) -> str | None:
    """`<reason>@<model>` of a request a gateway sent to a fallback; None for any other."""
    value = (parameters or {}).get(FALLBACK_OF)
    return value if isinstance(value, str) else None
