"""Settings of admission control at the gateway (docs/overload.md)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings

from tidegate.core.settings import settings_config

__all__ = ["AdmissionSettings"]


class AdmissionSettings(BaseSettings):
    """Admission from measured load (env prefix `TIDEGATE_ADMISSION_`)."""

    model_config = settings_config("TIDEGATE_ADMISSION_")

    slo_s: float = Field(
        0.1,
        gt=0,
        description="The latency objective of real-time calls. A model's in-flight limit never "
        "shrinks while its calls take under half of it; above that, only when they queue "
        "(`latency_tolerance`). A call that waits longer than this for a result that never "
        "comes counts with its wait.",
    )
    latency_tolerance: float = Field(
        1.5,
        ge=1,
        description="How many times its no-load latency a model's calls may take before its "
        "limit shrinks (Gradient2's RTT tolerance): past it, calls queue.",
    )
    initial_limit: int = Field(
        256,
        ge=1,
        description="Calls in flight a model may start with, before any is measured: enough "
        "for a cold start's first slow seconds (200 calls/s at 1.2 s).",
    )
    min_limit: int = Field(
        16,
        ge=1,
        description="The in-flight limit of a model never shrinks below this: a stall of the "
        "host at low load is not a backlog (16 in flight fit 100 ms at 160 calls/s).",
    )
    tick_s: float = Field(
        0.1, gt=0, description="How often the limits and service rates are brought up to date."
    )
    batch_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="Share of a model's in-flight limit the batch lane may use; past it, and at "
        "half its wait budget, batch calls are refused while real-time ones still get in.",
    )
    worker_group: str = Field(
        "tidegate-workers",
        description="The workers' consumer group, whose lag on the requests topic is probed.",
    )
    probe_interval_s: float = Field(
        0.5,
        gt=0,
        description="How often the workers' lag is read (one admin round trip on a thread).",
    )
    probe: bool = Field(
        True, description="Read the workers' lag; off, only this gateway's own calls count."
    )
    lag_floor: int = Field(
        64,
        ge=0,
        description="A lag up to this many requests is work the workers hold between commits, "
        "not a backlog: it adds no delay.",
    )
