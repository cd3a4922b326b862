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
        description="The latency objective of real-time calls: a model's in-flight limit shrinks "
        "while more than `slo_miss_ratio` of its calls take longer.",
    )
    slo_miss_ratio: float = Field(
        0.01,
        ge=0,
        lt=1,
        description="Share of a tick's calls that may exceed `slo_s` before the limit shrinks "
        "(0.01: the p99 is held at the SLO).",
    )
    initial_limit: int = Field(
        64, ge=1, description="Calls in flight a model may start with, before any is measured."
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
