"""Logging set-up shared by every tidegate process.

Records go to stderr as text (the default) or as one JSON object per line (`log_json`), which then
also carries the trace and span ids of the span current where the record was made, and the
`request_id` of a record that names one (`log.warning(..., extra={"request_id": rid})`).

Two filters keep a bad hour readable. `LineCap` cuts a message (and each line of a traceback)
past `log_max_bytes`, saying how much it cut: a poison pill's decoding error once quoted both
Avro schemas whole, 20 KB a line. `RepeatSummary` lets the first of a run of like warnings and
errors through (alike once digits are masked, so the same reconnect to any broker, or the same
failure at any offset, is one kind) and holds back the rest for `log_repeat_interval_s`; the
first one after the interval says how many were held back. librdkafka's lines come through
Python logging as well (`tidegate.core.kafka` hands producers and consumers the `librdkafka`
logger), where a Kafka outage used to write a reconnect line per client every few hundred
milliseconds straight to stderr.

Metrics use prometheus-client's default registry; each component declares its own metrics next to
the code they measure.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from opentelemetry import trace

from tidegate.core.telemetry_settings import TelemetrySettings

__all__ = [
    "RDKAFKA_LOGGER",
    "LineCap",
    "RepeatSummary",
    "configure_logging",
    "get_logger",
]

RDKAFKA_LOGGER = "librdkafka"
"""The logger librdkafka's own log lines go to."""

_TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
_DIGITS = re.compile(r"\d+")


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id is not None:
            payload["request_id"] = str(request_id)
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            payload["trace_id"] = trace.format_trace_id(context.trace_id)
            payload["span_id"] = trace.format_span_id(context.span_id)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            payload["exc"] = record.exc_text
        return json.dumps(payload)


def _message(record: logging.LogRecord) -> str | None:
    """The record's message; None when its arguments do not fit its format, which the handler
    then reports as logging does (a filter that raised would raise into the caller)."""
    try:
        return record.getMessage()
    except Exception:
        return None


def _cap(text: str, limit: int) -> str:
    # A character is at most 4 bytes in UTF-8: shorter texts need no encoding to be measured.
    if len(text) * 4 <= limit:
        return text
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text
    kept = data[:limit].decode("utf-8", "ignore")
    return f"{kept}... ({len(data) - len(kept.encode())} more bytes)"


class LineCap(logging.Filter):
    """Cuts a record's message, and each line of its traceback, to `limit` UTF-8 bytes."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self._limit = limit
        self._format = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        message = _message(record)
        if message is None:
            return True
        capped = _cap(message, self._limit)
        if capped is not message:
            record.msg, record.args = capped, None
        if record.exc_info and not record.exc_text:
            lines = self._format.formatException(record.exc_info).splitlines()
            record.exc_text = "\n".join(_cap(line, self._limit) for line in lines)
        return True


class RepeatSummary(logging.Filter):
    """Holds back warnings and errors like one let through less than `interval_s` ago, and has
    the next one after that say how many it held back. Records below WARNING always pass."""

    _MAX_KINDS = 1024

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._interval = interval_s
        self._clock = clock
        # kind -> [when one was last let through, how many were held back since]
        self._seen: dict[tuple[str, int, str, str], list[float]] = {}
        # Handlers filter outside their lock, so records of several threads meet here.
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        message = _message(record)
        if message is None:
            return True
        # The exception's type too: a second cause behind the same words is news.
        failure = record.exc_info[0].__name__ if record.exc_info and record.exc_info[0] else ""
        kind = (record.name, record.levelno, _DIGITS.sub("#", message), failure)
        now = self._clock()
        with self._lock:
            seen = self._seen.get(kind)
            if seen is not None and now - seen[0] < self._interval:
                seen[1] += 1
                return False
            if seen is None and len(self._seen) >= self._MAX_KINDS:
                self._seen.pop(next(iter(self._seen)))
            self._seen[kind] = [now, 0]
        if seen is not None and seen[1]:
            held, since = int(seen[1]), now - seen[0]
            record.msg = f"{message} [{held} more like this in the last {since:.0f} s]"
            record.args = None
        return True


def configure_logging(settings: TelemetrySettings | None = None) -> None:
    """Configure the root logger once per process, to stderr."""
    settings = settings or TelemetrySettings()
    handler = logging.StreamHandler(sys.stderr)
    if settings.log_json:
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(_TEXT_FORMAT))
    if settings.log_max_bytes:
        handler.addFilter(LineCap(settings.log_max_bytes))
    if settings.log_repeat_interval_s:
        handler.addFilter(RepeatSummary(settings.log_repeat_interval_s))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level)


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(name)
