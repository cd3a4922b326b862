"""Settings of the worker agents."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings

from tidegate.core.event_loops import EventLoopKind
from tidegate.core.kafka import GroupProtocol
from tidegate.core.pool_names import POOL_PATTERN
from tidegate.core.settings import instance_id, settings_config

__all__ = ["WorkerSettings"]


class WorkerSettings(BaseSettings):
    """Worker agents (env prefix `TIDEGATE_WORKER_`)."""

    model_config = settings_config("TIDEGATE_WORKER_")

    group_id: str = Field("tidegate-workers", description="Consumer group all workers share.")
    pool: str | None = Field(
        None,
        pattern=POOL_PATTERN,
        description="The model pool this worker serves (docs/pools.md): it reads the pool's "
        "requests and retry topics in the group `<group_id>.<pool>`, and keeps the models "
        "placed in the pool loaded. None: the default pool.",
    )
    worker_id: str = Field(default_factory=instance_id, description="This worker's name.")
    event_loop: EventLoopKind = Field(
        "auto",
        description="The asyncio event loop `tidegate worker` runs on: `uvloop` (its loop in C, "
        "about 4-9% less worker CPU per request, decision 028), `asyncio` (the standard "
        "library's), or `auto`, uvloop where it is installed.",
    )
    max_batch_size: int = Field(32, ge=1, le=4096, description="Most requests in one batch.")
    max_batch_delay_ms: float = Field(
        0.0,
        ge=0,
        le=10_000,
        description="How long an idle model waits for a fuller batch, in milliseconds; 0 "
        "dispatches at once (a busy model's next batch collects while it runs anyway).",
    )
    fetch_window_ms: float = Field(
        10.0,
        ge=0,
        le=1000,
        description="While requests arrive faster than they are read (a poll found more than "
        "one), how long it keeps collecting, in milliseconds (0: never), counted from when the "
        "previous batch went to the model for a request already waiting: larger batches and "
        "less CPU per request under load; a lone request goes at once.",
    )
    fetch_idle_ms: float = Field(
        2.0,
        gt=0,
        le=1000,
        description="The fetch window closes early when its first `fetch_idle_ms` bring no more "
        "requests: a burst read at once (one producer's batch, as the gateway's publishes "
        "arrive) goes without waiting out the window. At or above `fetch_window_ms`, the "
        "window never closes early.",
    )
    delivery: Literal["at-least-once", "exactly-once"] = Field(
        "at-least-once",
        description="`exactly-once` consumes, processes and produces in Kafka transactions: "
        "results, replies and dead letters are committed atomically with the input offsets.",
    )
    transaction_interval_ms: float = Field(
        25.0,
        gt=0,
        le=60_000,
        description="Exactly-once: how often the open transaction is committed. Results become "
        "visible to read_committed readers only then, so this adds to their latency.",
    )
    transaction_timeout_ms: int = Field(
        10_000,
        ge=1000,
        description="Exactly-once: how long the brokers keep a dead worker's open transaction "
        "before aborting it (and so how long read_committed readers of its partitions wait).",
    )
    transactional_id: str | None = Field(
        None,
        description="Exactly-once: this process's transactional.id (default: group id and worker "
        "id). A restart with the same id fences and aborts the previous one at once.",
    )
    processes: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="Worker processes `tidegate worker` runs on this host, all in the one group "
        "(default: one per core).",
    )
    retry_relay: bool = Field(
        True,
        description="Run the retry relay in this process: it sends requests waiting on the "
        "retry topics back to their partitions when due (group `<group_id>-retry`).",
    )
    stall_exit_s: float = Field(
        120.0,
        ge=0,
        description="A worker process whose event loop has not run for this long (a model call "
        "hung on it) exits with status 70, for its supervisor to restart it (0: never).",
    )
    metrics_port: int = Field(
        9100, ge=0, le=65535, description="Port of the Prometheus /metrics endpoint (0: none)."
    )
    max_in_flight: int = Field(
        2048, ge=1, description="Most consumed-but-unfinished requests before consuming pauses."
    )
    group_protocol: GroupProtocol = Field(
        "classic",
        description="The consumer group protocol: `classic` (cooperative-sticky; each worker "
        "sends the session timeout and heartbeat interval) or `consumer` (KIP-848: the brokers "
        "assign, and the group's own config holds both, which each worker sets through the "
        "admin API at start). Decision 015 and docs/takeover.md compare them.",
    )
    session_timeout_ms: int = Field(
        2_000,
        ge=1000,
        description="How long the group waits for a silent worker before moving its partitions "
        "(a dead worker's partitions move about this long after it died). The brokers' floor "
        "must allow it: `group.min.session.timeout.ms` (classic) or "
        "`group.consumer.min.session.timeout.ms` (consumer).",
    )
    heartbeat_interval_ms: int = Field(
        500,
        ge=100,
        description="How often a worker tells the group it is alive; below the session timeout "
        "(a quarter of it leaves room for lost heartbeats). Sent from librdkafka's own thread, "
        "so a busy event loop does not delay it.",
    )
    drain_timeout_s: float = Field(
        30.0,
        gt=0,
        description="How long revoked partitions and shutdown may finish in-flight work.",
    )
    max_loaded_versions: int = Field(
        8,
        ge=1,
        le=1024,
        description="Most model versions kept loaded; the least recently used unwanted one goes.",
    )
    memory_budget_mib: int | None = Field(
        None,
        ge=1,
        description="Resident memory, in MiB, the loaded model versions may take on this worker "
        "(docs/pools.md): past it the least recently used idle versions are unloaded, and a "
        "version that does not fit loads when a request asks for it. Each version counts as the "
        "growth of the process's RSS measured at its load. None: only max_loaded_versions limits.",
    )
    batch_share: float = Field(
        0.1,
        gt=0,
        le=1,
        description="The least share of its time a worker computes the batch lane while the "
        "real-time lane is busy (docs/lanes.md); the batch lane has it all while real-time is "
        "idle. Its consumer group is `<group_id>-batch`.",
    )
    realtime_idle_ms: float = Field(
        10.0,
        ge=0,
        le=60_000,
        description="How long after its last batch the real-time lane counts as idle, and the "
        "batch lane may use the whole worker (docs/lanes.md): longer protects real-time latency "
        "from batch-lane batches started in the gaps of its traffic, shorter gives the batch "
        "lane more of the time real-time leaves free.",
    )
    shadow_max_in_flight: int = Field(
        4,
        ge=0,
        description="Shadow sub-batches running at once; more are skipped and counted (0: none).",
    )

    @model_validator(mode="after")
    def _heartbeat_within_session(self) -> WorkerSettings:
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError("heartbeat_interval_ms must be below session_timeout_ms")
        return self
