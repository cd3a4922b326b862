"""Logging set-up shared by every tidegate process.

Metrics use prometheus-client's default registry; each component declares its own metrics next to
the code they measure.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

from tidegate.core.settings import TelemetrySettings

__all__ = ["configure_logging", "get_logger"]


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return json.dumps(payload)


def configure_logging(settings: TelemetrySettings | None = None) -> None:
    """Configure the root logger once per process, to stderr."""
    settings = settings or TelemetrySettings()
    handler = logging.StreamHandler(sys.stderr)
    if settings.log_json:
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level)


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(name)
