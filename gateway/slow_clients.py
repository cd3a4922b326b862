"""Cutting off slow and greedy HTTP clients at the connection, before the app sees them:
`GatewayHttpProtocol`, uvicorn's httptools protocol with header and body deadlines, a header
size cap and a per-client connection cap (`ConnectionLimits`), which also answers admission's
refusals before the app runs.
The limits and why: docs/gateway-hardening.md ("Slow clients are cut off"); the refusals:
docs/overload.md ("Refused before anything else runs").
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tidegate.core.telemetry import get_logger
from tidegate.gateway.admission.admission_control import ADMISSION_STATE, BATCH, REALTIME, Admission
from tidegate.gateway.admission.refusals import refusal_app
from tidegate.gateway.gateway_settings import GatewaySettings

__all__ = ["ConnectionLimits", "GatewayHttpProtocol", "guarded_protocol"]

_log = get_logger(__name__)


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float
    body_timeout_s: float
    max_connections_per_client: int
    max_header_bytes: int = 64 * 1024
    # A call's wait budget when it sends no Request-Timeout, and the most it may ask for.
    default_wait_s: float = 10.0
    max_wait_s: float = 120.0

    @classmethod
    def of(cls, settings: GatewaySettings) -> ConnectionLimits:
        return cls(
            settings.header_timeout_s,
            settings.body_timeout_s,
            settings.max_connections_per_client,
            settings.max_header_bytes,
            min(settings.default_timeout_s, settings.max_timeout_s),
            settings.max_timeout_s,
        )


def _problem(status: int, phrase: str, code: str, detail: str) -> bytes:
    """A whole HTTP/1.1 response with an RFC 9457 body, written without the app."""
    body = json.dumps(
        {
            "type": f"urn:tidegate:problem:{code.lower().replace('_', '-')}",
            "title": phrase,
            "status": status,
            "detail": detail,
            "error": detail,
            "code": code,
            "retriable": True,
        }
    ).encode()
    head = (
        f"HTTP/1.1 {status} {phrase}\r\n"
        "content-type: application/problem+json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


_HEADERS_LATE = _problem(
    408, "Request Timeout", "REQUEST_TIMEOUT", "the request headers did not arrive in time"
)
_BODY_LATE = _problem(
    408, "Request Timeout", "REQUEST_TIMEOUT", "the request body did not arrive in time"
)
_HEADERS_TOO_LARGE = _problem(
    431,
    "Request Header Fields Too Large",
    "HEADERS_TOO_LARGE",
    "the request line and headers exceed the gateway's limit",
)
_TOO_MANY = _problem(
    429,
    "Too Many Requests",
    "TOO_MANY_CONNECTIONS",
    "this client holds too many open connections; reuse one or close some",
)


_INFER_PREFIX = b"/v2/models/"
# A connection cut off after its answer reads and drops what the client still sends for this long
# or this many bytes, so that closing with unread bytes does not send an RST over the answer.
_LINGER_S = 2.0
_LINGER_BYTES = 1 << 20


class GatewayHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with header and body deadlines, a per-client cap, and
    admission's refusals answered before the app runs."""

    limits: ClassVar[ConnectionLimits | None] = None
    # Open connections per client address, in this process (each class keeps its own).
    open_per_client: ClassVar[Counter[str]] = Counter()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cls = type(self)
        if cls.limits is None:
            cls.limits = ConnectionLimits.of(GatewaySettings())
        self._limits: ConnectionLimits = cls.limits
        self._peer: str | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._request_begun = False
        # The head of the current request is still arriving, and how many bytes of it have.
        self._in_head = True
        self._head_bytes = 0
        # Bytes still to drop while lingering after a cut-off answer; None when not lingering.
        self._lingering: int | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        peer = self.client[0] if self.client else None
        if peer is not None:
            counts = type(self).open_per_client
            if counts[peer] >= self._limits.max_connections_per_client:
                _log.warning(
                    "refused a connection from %s: it holds %d already", peer, counts[peer]
                )
                transport.write(_TOO_MANY)
                transport.close()
                return
            counts[peer] += 1
            self._peer = peer
        self._arm(self._limits.header_timeout_s, _HEADERS_LATE, "headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._peer is not None:
            counts = type(self).open_per_client
            counts[self._peer] -= 1
            if counts[self._peer] <= 0:
                del counts[self._peer]
            self._peer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering is not None:
            self._lingering -= len(data)
            if self._lingering < 0:
                self.transport.close()
            return
        # The head (request line and headers) is counted here, as raw bytes read, rather than in
        # the parser's callbacks: httptools joins a header's fragments itself and calls on_header
        # only once the header is whole, so one header of gigabytes would be held in memory
        # before any callback saw a byte of it. httptools sets no bound of its own.
        #
        # Bytes from the end of one request (on_message_complete) to the end of the next one's
        # headers count; its body does not. A chunk that would take the count past the limit is
        # fed only up to the limit: if the headers are still not complete, the request is refused.
        # A pipelined request that begins inside a chunk read for the one before is counted from
        # the next chunk on, so its head may pass the limit by at most one read (256 KiB).
        limit = self._limits.max_header_bytes
        while self._in_head:
            room = limit - self._head_bytes
            if len(data) <= room:
                self._head_bytes += len(data)
                break
            if room <= 0:
                self._refuse_head()
                return
            self._head_bytes = limit
            super().data_received(data[:room])
            data = data[room:]
            if self.transport.is_closing() or self.transport.get_protocol() is not self:
                return  # refused as invalid, or upgraded to another protocol
        super().data_received(data)

    def _refuse_head(self) -> None:
        self._disarm()
        cycle = self.cycle
        # A pipelined request's head: the one before it, if any, must not be answered over.
        if cycle is None or cycle.response_complete:
            self.transport.write(_HEADERS_TOO_LARGE)
        _log.warning(
            "cut off %s: its request line and headers exceed %d bytes",
            self._peer,
            self._limits.max_header_bytes,
        )
        self._close_after_answer()

    # Parser callbacks: a request begins, its headers end, its body ends.
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._request_begun = True
        if self._timer is None:  # a later request on a kept-alive connection
            self._arm(self._limits.header_timeout_s, _HEADERS_LATE, "headers")

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm()
        refused = self._refusal()
        if refused is None:
            super().on_headers_complete()
        else:
            # This request's cycle runs the canned refusal instead of the app; the next one on
            # the connection runs the app again. The unread body is discarded as it arrives.
            app, self.app = self.app, refused
            try:
                super().on_headers_complete()
            finally:
                self.app = app
        # A pipelined request waits, unread, behind the one being answered: its body deadline
        # starts when it becomes the current one (on_response_complete).
        if not self.pipeline:
            self._arm(self._limits.body_timeout_s, _BODY_LATE, "body")

    def _refusal(self) -> Any:
        """A canned 503 for an inference call admission refuses now, else None. Costs a prefix
        test for any other request, and a header scan and a few comparisons for an admitted one."""
        url = self.url
        if not url.startswith(_INFER_PREFIX):
            return None
        gate: Admission | None = self.app_state.get(ADMISSION_STATE)
        if gate is None or self.parser.get_method() != b"POST":
            return None
        path = url.split(b"?", 1)[0]
        if not path.endswith(b"/infer"):
            return None
        model = path[len(_INFER_PREFIX) :].split(b"/", 1)[0].decode("latin-1")
        wait_s, lane = self._budget()
        reason = gate.refusal(model, wait_s, lane)
        if reason is None or gate.diverts(model):
            return None
        known = gate.model_load(model) is not None
        return refusal_app(model if known else None, reason, gate.retry_after_s(model))

    def _budget(self) -> tuple[float | None, str]:
        """The call's wait budget from `Request-Timeout` (None when it is not a positive number:
        the app answers that with 400) and its lane from `Tidegate-Lane` (real-time unless it
        says batch; a lane named only in the body's parameters is the app's to apply)."""
        limits = self._limits
        wait: float | None = limits.default_wait_s
        lane = REALTIME
        for name, value in self.headers:
            if name == b"request-timeout":
                try:
                    given = float(value)
                except ValueError:
                    given = 0.0
                wait = min(given, limits.max_wait_s) if given > 0 else None
            elif name == b"tidegate-lane" and value.strip().lower() == b"batch":
                lane = BATCH
        return wait, lane

    def on_message_complete(self) -> None:
        self._disarm()
        self._request_begun = False
        self._in_head = True  # what follows is the next request's head
        self._head_bytes = 0
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        cycle = self.cycle
        waiting = cycle is not None and cycle.more_body and not cycle.response_complete
        if waiting and self._timer is None and not self.transport.is_closing():
            self._arm(self._limits.body_timeout_s, _BODY_LATE, "body")

    def _arm(self, delay_s: float, answer: bytes, part: str) -> None:
        self._disarm()
        self._timer = self.loop.call_later(delay_s, self._too_slow, answer, part)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _too_slow(self, answer: bytes, part: str) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if part == "headers":
            # No cycle yet for this request; the last one, if any, must be answered in full.
            free = cycle is None or cycle.response_complete
        else:
            free = cycle is not None and not cycle.response_started
        if self._request_begun and free:
            self.transport.write(answer)
        if cycle is not None and not cycle.response_complete:
            # The app, if it still waits for the body, reads a disconnect; what it sends is dropped.
            cycle.disconnected = True
            cycle.message_event.set()
        _log.warning("cut off %s: its request %s did not arrive in time", self._peer, part)
        self._close_after_answer()

    def _close_after_answer(self) -> None:
        """Close once the client can read the answer, as nginx's lingering close does: send FIN
        after it, then read and drop what the client still sends (it may be mid-way through a
        head or body) until it closes, for at most `_LINGER_S` or `_LINGER_BYTES`. Closing at
        once with unread bytes sends an RST, which can destroy the answer before it is read."""
        transport = self.transport
        if not transport.can_write_eof():  # TLS: close_notify, then close
            transport.close()
            return
        transport.write_eof()
        self._lingering = _LINGER_BYTES
        self._disarm()
        self._timer = self.loop.call_later(_LINGER_S, transport.close)


def guarded_protocol(limits: ConnectionLimits) -> type[GatewayHttpProtocol]:
    """A protocol class with these limits and a connection count of its own."""
    namespace = {"limits": limits, "open_per_client": Counter()}
    return type("GuardedHttpProtocol", (GatewayHttpProtocol,), namespace)
