"""Settings of what every process reports about itself: its logs and its traces."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings

from tidegate.core.settings import settings_config

__all__ = ["TelemetrySettings", "TracingSettings"]


class TelemetrySettings(BaseSettings):
    """Logging and metrics (env prefix `TIDEGATE_TELEMETRY_`)."""

    model_config = settings_config("TIDEGATE_TELEMETRY_")

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="Root log level."
    )
    log_json: bool = Field(
        False,
        description="Log one JSON object per line instead of text, with the trace and span ids "
        "of the current span and the request id of records that name one.",
    )
    log_max_bytes: int = Field(
        2048,
        ge=0,
        description="Longest message of one record, in UTF-8 bytes; the rest is cut and counted "
        "(0: no limit).",
    )
    log_repeat_interval_s: float = Field(
        30.0,
        ge=0,
        description="A warning or error that repeats (digits aside) within this many seconds is "
        "held back and counted; the next one after the interval says how many were (0: off).",
    )


class TracingSettings(BaseSettings):
    """OpenTelemetry tracing, exported over OTLP (env prefix `TIDEGATE_TRACING_`). Off by default:
    then no span is made and no header is read or written."""

    model_config = settings_config("TIDEGATE_TRACING_")

    enabled: bool = Field(False, description="Trace requests through the gateway and workers.")
    endpoint: str = Field(
        "http://127.0.0.1:4318",
        description="The OTLP collector: the base URL for http/protobuf (/v1/traces is appended "
        "unless the URL has a path), host:port or URL for grpc.",
    )
    protocol: Literal["http/protobuf", "grpc"] = Field(
        "http/protobuf",
        description="OTLP transport; grpc needs the `otlp-grpc` extra (its exporter package).",
    )
    sample_ratio: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description="Share of new traces sampled; a request that arrives with a trace keeps its "
        "caller's decision (parent-based).",
    )
    service_name: str | None = Field(
        None,
        description="service.name of this process's spans (default: tidegate-<component>, e.g. "
        "tidegate-gateway, tidegate-worker).",
    )
    export_timeout_s: float = Field(
        10.0, gt=0, description="How long one export to the collector may take."
    )
