"""Settings of the model lifecycle: event store, outbox relay, canary controller, retention."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings

from tidegate.core.event_loops import EventLoopKind
from tidegate.core.settings import settings_config

__all__ = ["LifecycleSettings"]


class LifecycleSettings(BaseSettings):
    """The model lifecycle: event store, outbox relay and rollout controller
    (env prefix `TIDEGATE_LIFECYCLE_`)."""

    model_config = settings_config("TIDEGATE_LIFECYCLE_")

    pool_min_size: int = Field(1, ge=0, le=100, description="Connections the pool keeps open.")
    pool_max_size: int = Field(4, ge=1, le=100, description="Most connections in the pool.")
    outbox_poll_s: float = Field(
        0.5, gt=0, le=60, description="How often the relay looks for unpublished events."
    )
    promote_min_agreement: float = Field(
        0.9,
        ge=0,
        le=1,
        description="Least shadow class agreement (or cosine similarity) `promote` accepts.",
    )
    promote_min_samples: int = Field(
        100, ge=0, description="Fewest shadow comparisons before the agreement gate can pass."
    )
    require_backtest: bool = Field(
        False,
        description="`promote` also needs a recent passing backtest of the candidate against the "
        "current primary (`tidegate backtest`, docs/backtest.md); `--force` overrides it like "
        "the shadow gate.",
    )
    backtest_min_agreement: float = Field(
        0.9,
        ge=0,
        le=1,
        description="Least backtest class agreement (or mean cosine similarity) the gate accepts.",
    )
    backtest_min_rows: int = Field(
        100, ge=1, description="Fewest rows a backtest must compare before it can pass."
    )
    backtest_max_age_h: float = Field(
        24.0, gt=0, description="A backtest older than this many hours no longer counts."
    )
    backtest_max_error_rate: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Most candidate errors per request with a served result a backtest may have.",
    )
    backtest_max_abs_diff: float | None = Field(
        None,
        ge=0,
        description="When set, the largest absolute output difference a passing backtest may "
        "show; the only measure for models that are neither classifiers nor embeddings.",
    )
    canary_steps: tuple[int, ...] = Field(
        (10, 50, 100), description="Default canary weights in percent, ending at 100."
    )
    canary_dwell_s: float = Field(60.0, gt=0, description="Default time at each canary step.")
    canary_max_error_rate: float = Field(
        0.05, ge=0, le=1, description="Roll back when the candidate's error rate exceeds this."
    )
    canary_max_error_rate_increase: float = Field(
        0.02,
        ge=0,
        le=1,
        description="Roll back when the candidate's error rate exceeds the baseline's by this.",
    )
    canary_max_p99_ratio: float = Field(
        2.0, gt=0, description="Roll back when the candidate's p99 exceeds baseline's times this."
    )
    canary_min_requests: int = Field(
        20, ge=1, description="Candidate results needed before thresholds are judged."
    )
    canary_confidence_z: float = Field(
        1.645,
        ge=0,
        le=5,
        description="Error rates are judged by the lower bound of their Wilson interval at this "
        "z (1.645: one-sided 95%), so a handful of errors in a small sample does not roll back.",
    )
    canary_warm_timeout_s: float = Field(
        600.0,
        gt=0,
        description="Roll a canary back when no worker has warmed its candidate in this time.",
    )
    canary_min_latency_samples: int = Field(
        100, ge=1, description="Results each side needs before the p99 ratio is judged."
    )
    canary_min_p99_gap_ms: float = Field(
        10.0, ge=0, description="A p99 regression must also exceed the baseline's by this much."
    )
    indexer_gather_s: float = Field(
        0.5,
        ge=0,
        le=10,
        description="How long the lineage indexer gathers results into one batch (one fetch, "
        "one transaction, one commit) after the first arrives: `tidegate served` and the canary "
        "windows see a result up to this much later, and the controller's cost follows batches, "
        "not results.",
    )
    controller_event_loop: EventLoopKind = Field(
        "auto",
        description="The asyncio event loop `tidegate controller` runs on: `uvloop`, `asyncio` "
        "(the standard library's), or `auto`, uvloop where it is installed (decision 028).",
    )
    controller_tick_s: float = Field(
        0.5, gt=0, le=60, description="How often the canary controller evaluates."
    )
    lineage_retention_days: float = Field(
        30.0,
        ge=0,
        le=36500,
        description="The controller deletes `served_requests` and `shadow_comparisons` rows older "
        "than this (0: keep them forever). Never less than the canary windows' horizon.",
    )
    lineage_prune_every_s: float = Field(
        600.0, gt=0, description="How often the controller deletes expired lineage rows."
    )
    workers_group_id: str = Field(
        "tidegate-workers",
        description="The workers' consumer group (TIDEGATE_WORKER_GROUP_ID): the controller "
        "exports its lag for every partition of the requests topic, held or not.",
    )
    group_lag_every_s: float = Field(
        15.0, gt=0, le=3600, description="How often the controller reads the workers' lag."
    )
    pool_scaling_every_s: float = Field(
        15.0,
        gt=0,
        le=3600,
        description="How often the controller exports each pool's desired workers "
        "(`tidegate_pool_desired_workers`, docs/pools.md).",
    )
    pool_scaling_window_s: float = Field(
        30.0,
        ge=1,
        le=3600,
        description="The window a pool's request rate is counted over; its trend compares the "
        "last window with the one before.",
    )
    pool_worker_rate: float = Field(
        500.0,
        gt=0,
        description="Requests a second one worker serves, for pools not in pool_worker_rates "
        "(measure yours with `make bench`).",
    )
    pool_worker_rates: dict[str, float] = Field(
        default_factory=dict,
        description="Requests a second one worker of each named pool serves (JSON object).",
    )
    pool_worker_start_s: float = Field(
        30.0,
        ge=0,
        le=3600,
        description="How long a new worker takes to start before it loads models (pod "
        "scheduling, image, process): added to its pool's load time to get how far ahead the "
        "desired workers look.",
    )
