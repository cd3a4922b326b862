"""The 503 the HTTP protocol answers for a call admission refuses, without the app.

A bare ASGI callable: two `send`s of a prepared problem body (RFC 9457, as
`tidegate.gateway.problems` writes it for `OverloadedError`) with `Retry-After`, counted as the
app would count a 503. It reads no body: uvicorn drops what still arrives of it, and the
connection stays open for the next request.
"""

from __future__ import annotations

import json
from typing import Any

from tidegate.core.errors import OverloadedError
from tidegate.gateway import http_metrics as metrics
from tidegate.gateway.problems import problem_type

__all__ = ["refusal_app"]

# Metric label of a refusal for a model this replica has not admitted a call of yet.
_NO_MODEL = "_unknown"
_TYPE = problem_type(OverloadedError.code)
_CONTENT_TYPE = (b"content-type", b"application/problem+json")


class _Refusal:
    __slots__ = ("_detail", "_model", "_retry_after_s")

    def __init__(self, model: str | None, detail: str, retry_after_s: int) -> None:
        self._model = model or _NO_MODEL
        self._detail = detail
        self._retry_after_s = retry_after_s

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        detail, retry_after_s = self._detail, self._retry_after_s
        body = json.dumps(
            {
                "type": _TYPE,
                "title": "Service Unavailable",
                "status": 503,
                "detail": detail,
                "instance": scope["path"],
                "error": detail,
                "code": OverloadedError.code,
                "retriable": True,
                "retry_after_s": retry_after_s,
            }
        ).encode()
        headers = [
            _CONTENT_TYPE,
            (b"content-length", str(len(body)).encode("ascii")),
            (b"retry-after", str(retry_after_s).encode("ascii")),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        metrics.SHED.inc()
        metrics.count_request(self._model, "", 503)


def refusal_app(model: str | None, detail: str, retry_after_s: int) -> _Refusal:
    """The ASGI app answering one refused call of `model` (None: one not served here yet)."""
    return _Refusal(model, detail, retry_after_s)
